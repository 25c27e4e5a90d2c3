"""A real PostgreSQL server for the user-store tests: Debian's binaries (``postgresql`` package; `make setup`
installs it where apt can), a throw-away cluster in a temporary folder, trust auth on 127.0.0.1 and a free port,
stopped at the end. PostgreSQL refuses to run as root, so as root the server runs as ``nobody``."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.local_nodes import free_port


def postgres_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(versions[-1]).parent if versions else None


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server with its data in a new folder under the system's temp folder (pytest's own is private to
    root, which ``nobody`` cannot enter); yields a SQLAlchemy URL (pg8000 driver) of its database."""
    binaries = postgres_bin()
    if binaries is None:
        if os.environ.get("PR_RLHF_ALL_EXTRAS") == "1":
            pytest.fail("PostgreSQL's binaries must be installed here (`make setup` installs Debian's package)",
                        pytrace=False)
        pytest.skip("PostgreSQL is not installed")
    folder = Path(tempfile.mkdtemp(prefix="pr_rlhf_pg_"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "nobody")
        as_user = ["runuser", "-u", "nobody", "--"]
    data, port = folder / "data", free_port()
    def run(*args: str) -> None:
        done = subprocess.run([*as_user, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:1])} failed ({done.returncode}): {done.stdout[-1500:]}"
                               f"{done.stderr[-1500:]}")

    run(str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "pr", "--no-sync", "-E", "UTF8")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
    run(str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start")
    try:
        yield f"postgresql+pg8000://pr@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
