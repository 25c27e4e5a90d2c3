"""What a local Ray cluster's logs say about why something in it died, read before its temp dir is removed.

A test sees only "the actor died unexpectedly" or, when the raylet goes, a driver that exits with code 1 and one
line ("Failed to get the system config from raylet because it is dead"); the reason is in the session's logs.
"""
from __future__ import annotations

from pathlib import Path

FATAL = "Fatal Python error"
# the cluster's own daemons: a raylet or GCS that exits logs why at the end of its .out/.err ("Check failed",
# "fate-shares with the agent", a signal)
DAEMON_LOGS = ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err", "runtime_env_agent.err",
               "dashboard_agent.err")
TAIL_LINES = 8
LINE_CHARS = 240   # a test failure shows a few thousand characters of output: room for every daemon's tail


def worker_crashes(temp_dir: str | Path) -> list[str]:
    """Every fatal-signal report in the Ray session's worker logs: faulthandler's first line and the Python stack
    under it (the list of extension modules after it left out)."""
    reports = []
    for log in sorted(Path(temp_dir).glob("session_latest/logs/*.err")):
        text = log.read_text(errors="replace")
        at = text.find(FATAL)
        while at >= 0:
            block = text[at:].split("\n\n", 2)   # the error line, the stack, then the module list
            reports.append(f"{log.name}: " + "\n".join(block[:2]))
            at = text.find(FATAL, at + len(FATAL))
    return reports


def daemon_tails(temp_dir: str | Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of each non-empty daemon log of the session (raylet, GCS, agents)."""
    logs = Path(temp_dir) / "session_latest" / "logs"
    tails = []
    for name in DAEMON_LOGS:
        path = logs / name
        text = path.read_text(errors="replace").strip() if path.is_file() else ""
        if text:
            # (the raylet's periodic state dumps say nothing about its end)
            kept = [line for line in text.splitlines() if "[state-dump]" not in line]
            tail = [line[:LINE_CHARS] for line in kept[-lines:]]
            tails.append(f"--- {name} (last {lines} lines)\n" + "\n".join(tail))
    return tails


def driver_temp_dir(root: str | Path, driver_pid: int) -> Path | None:
    """The Ray temp dir under ``root`` whose session a driver with pid ``driver_pid`` started (its core log is
    ``python-core-driver-<job>_<pid>.log``), or None."""
    for log in Path(root).glob(f"ray-*/session_*/logs/python-core-driver-*_{driver_pid}.log"):
        return log.parents[2]
    return None


def crash_report(temp_dir: str | Path) -> str:
    """The daemons' log tails and the workers' fatal-signal stacks of the session in ``temp_dir``."""
    parts = daemon_tails(temp_dir) + [f"--- {report}" for report in worker_crashes(temp_dir)]
    return "\n".join(parts) if parts else "(the session's logs say nothing)"
