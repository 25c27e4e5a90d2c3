"""Local Ray nodes that tests start on 127.0.0.1 (each in its own session, as ``cluster/local_head.sh`` starts them)
and stop exactly: a free port, and the stop that checks nothing of a node is left running."""
from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL_HEAD = str(ROOT / "cluster" / "local_head.sh")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_nodes(dirs: list[Path], env: dict) -> None:
    """Stop the nodes whose temp dirs are ``dirs`` (newest first), remove the dirs, and assert that no process of
    theirs is left: those naming a node's temp dir, and the renamed ones of its session (ray::DashboardAgent, ...)."""
    sessions = {d: (d / "node.sid").read_text().strip() for d in dirs if (d / "node.sid").is_file()}
    for d in reversed(dirs):
        subprocess.run(["bash", LOCAL_HEAD, "stop", str(d)], env=env, timeout=120)
    left = subprocess.run(["ps", "-ww", "-eo", "sid=,stat=,args="], capture_output=True,
                          text=True).stdout.splitlines()
    alive = [line.split(None, 2) for line in left if len(line.split()) >= 2 and not line.split()[1].startswith("Z")]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        stray = [p[-1] for p in alive if f"{d}/session_" in p[-1] or p[0] == sessions.get(d)]
        assert d in sessions and not stray, f"the test's Ray node ({d}) is still running: {stray[:5]}"
