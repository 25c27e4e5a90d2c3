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

import pytest

from tests.ray_logs import worker_crashes
from workers.ray_utils import init_local_ray, shutdown_local_ray

RAY_TEST_CPUS = 4


@pytest.fixture(scope="session")
def ray_cluster():
    state = init_local_ray(num_cpus=RAY_TEST_CPUS)
    yield state
    # a crashed worker's stack, as a warning: the warnings summary sits at the end of the run's output
    for report in worker_crashes(state.temp_dir) if state.temp_dir else []:
        warnings.warn(f"a Ray worker crashed during the tests: {report}", RuntimeWarning, stacklevel=1)
    shutdown_local_ray()
