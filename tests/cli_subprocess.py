"""Running `pr-rlhf` as a user does, in its own process session, for the slow end-to-end tests.

A hang timeout kills the command's whole session, not only its driver, so nothing it started (Ray's daemons and
actors share fate with their driver, other helpers may not) keeps loading the cores of the tests that follow, and
the error shows the tail of what the command printed.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.ray_logs import crash_report, driver_temp_dir
from workers.ray_utils import private_temp_root

ROOT = Path(__file__).resolve().parents[1]


def kill_session(pid: int) -> None:
    """SIGKILL every process of the session ``pid`` leads (the command and everything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_cli(args: list[str], *, hang_timeout_s: float, cwd: Path = ROOT,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m pr_rlhf.cli ARGS`` with its output captured. ``hang_timeout_s`` catches a hang, not slowness:
    size it several times the slowest machine's measured time. On a hang the error carries the output's tail."""
    cmd = [sys.executable, "-m", "pr_rlhf.cli", *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=hang_timeout_s)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"`pr-rlhf {' '.join(args)}` still running after {hang_timeout_s:.0f} s (a hang?)\n"
                             f"{out[-3000:]}\n{err[-3000:]}") from None
    finally:
        kill_session(proc.pid)
    if proc.returncode != 0:
        err += ray_crash_report(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def ray_crash_report(pid: int) -> str:
    """Why the local Ray that the failed command ``pid`` started died, from its logs, and that temp dir removed:
    a command whose raylet dies exits at once (code 1, one line, no traceback) and leaves the dir behind."""
    temp_dir = driver_temp_dir(private_temp_root(), pid)
    if temp_dir is None:
        return ""
    report = crash_report(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)
    return f"\n--- the command's Ray session logs ({temp_dir.name}):\n{report}\n"
