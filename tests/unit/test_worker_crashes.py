"""tests.ray_fixtures.worker_crashes: a crashed Ray worker's fatal-signal report is found in the session's logs."""
from tests.ray_fixtures import worker_crashes

REPORT = ("Fatal Python error: Segmentation fault\n\nStack (most recent call first):\n"
          '  File "x.py", line 7 in save\n\nExtension modules: numpy.core, torch._C (total: 2)\n')


def test_finds_the_error_and_its_stack_without_the_module_list(tmp_path):
    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "worker-1-ffff-42.err").write_text("starting\n" + REPORT)
    (logs / "worker-2-ffff-43.err").write_text("a healthy worker\n")
    (logs / "raylet.out").write_text(REPORT)   # only workers' stderr logs are read
    [report] = worker_crashes(tmp_path)
    assert report.startswith("worker-1-ffff-42.err: Fatal Python error: Segmentation fault")
    assert 'line 7 in save' in report and "Extension modules" not in report


def test_no_logs_no_reports(tmp_path):
    assert worker_crashes(tmp_path) == []
