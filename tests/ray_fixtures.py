"""The Ray cluster of a test session: started once, on loopback, in a private temp dir, shut down at the end.

Use it from a test module that needs Ray with::

    from tests.ray_fixtures import ray_cluster  # noqa: F401

(``tests`` is a package of ours: verl's wheel ships a top-level ``tests`` package into site-packages, and pytest's
rootdir insertion puts this repository's first on sys.path.)

Several modules importing it still get one cluster: ``init_local_ray`` is a no-op while Ray is up and the
shutdown runs once, at the end of the session. 4 logical CPUs, so that several 0.25-1 CPU actors fit on a 2-core
machine.
"""
import warnings
from pathlib import Path

import pytest

from workers.ray_utils import init_local_ray, shutdown_local_ray

RAY_TEST_CPUS = 4
FATAL = "Fatal Python error"


def worker_crashes(temp_dir: str | Path) -> list[str]:
    """Every fatal-signal report in the Ray session's worker logs: faulthandler's first line and the Python stack
    under it (the list of extension modules after it left out). A test sees only "the actor died unexpectedly";
    the stack is in the worker's log, which the session's end removes with the temp dir."""
    reports = []
    for log in sorted(Path(temp_dir).glob("session_latest/logs/*.err")):
        text = log.read_text(errors="replace")
        at = text.find(FATAL)
        while at >= 0:
            block = text[at:].split("\n\n", 2)   # the error line, the stack, then the module list
            reports.append(f"{log.name}: " + "\n".join(block[:2]))
            at = text.find(FATAL, at + len(FATAL))
    return reports


@pytest.fixture(scope="session")
def ray_cluster():
    state = init_local_ray(num_cpus=RAY_TEST_CPUS)
    yield state
    # a crashed worker's stack, as a warning: the warnings summary sits at the end of the run's output
    for report in worker_crashes(state.temp_dir) if state.temp_dir else []:
        warnings.warn(f"a Ray worker crashed during the tests: {report}", RuntimeWarning, stacklevel=1)
    shutdown_local_ray()
