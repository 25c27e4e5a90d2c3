"""Test-session setup: stay offline and on loopback, and keep every temp file private to the run."""
import os

# Nothing may reach a hub; Ray listeners stay on 127.0.0.1.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_TIER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    # setup + call + teardown of every test, summed per tier folder (tests/unit, tests/integration, tests/e2e)
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if _TIER_SECONDS:
        terminalreporter.write_line("time per tier: " + ", ".join(
            f"{tier} {seconds / 60:.1f} min" for tier, seconds in sorted(_TIER_SECONDS.items())))
