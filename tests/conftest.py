"""Test-session setup: stay offline and on loopback, and keep every temp file private to the run."""
import os

# Nothing may reach a hub; Ray listeners stay on 127.0.0.1.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Parallel workers (`make test` runs two): each process and everything it starts (CLI subprocesses, local Ray
# clusters and their actors) runs one torch thread. Several processes with a thread per core each spin in OpenMP
# barriers and run the tiny models several times slower (docs/testing.md); pr_rlhf.threads caps explicit counts too.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    for _var in ("PR_RLHF_MAX_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

_TIER_SECONDS: dict[str, float] = {}
# `make test` hands whole files to two workers (pytest-xdist, --dist loadfile --no-loadscope-reorder) in the order
# below: the longest files first, the short ones last (longest processing time first), so that the workers finish
# together; the many small unit and integration files fill in at the end. Measured (docs/testing.md), longest first:
E2E_LONGEST_FIRST = ("test_psi_from_scratch.py", "test_rl.py", "test_ray_job_submit.py", "test_pgenrm_pipeline.py",
                     "test_benches.py", "test_rl_personalized.py", "test_pgenrm_real.py", "test_train_rm.py",
                     "test_build_cli.py")
_ORDER = ("e2e", "integration", "unit")


def _order(item) -> tuple[int, int]:
    parts = item.nodeid.split("::")[0].split("/")
    tier = _ORDER.index(parts[1]) if len(parts) > 2 and parts[0] == "tests" and parts[1] in _ORDER else len(_ORDER)
    name = parts[-1]
    return tier, (E2E_LONGEST_FIRST.index(name) if parts[1:2] == ["e2e"] and name in E2E_LONGEST_FIRST
                  else len(E2E_LONGEST_FIRST))


def pytest_collection_modifyitems(items):
    # a stable sort keeps each file's tests in their written order
    items.sort(key=_order)


def pytest_runtest_logreport(report):
    # setup + call + teardown of every test, summed per tier folder (tests/unit, tests/integration, tests/e2e)
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if _TIER_SECONDS:   # with several workers: their test time added up, more than the wall time
        terminalreporter.write_line("test time per tier (summed over workers): " + ", ".join(
            f"{tier} {seconds / 60:.1f} min" for tier, seconds in sorted(_TIER_SECONDS.items())))
