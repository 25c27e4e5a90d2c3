"""tests.ray_logs: why a local Ray cluster's worker or raylet died, found in the session's logs."""
from tests.ray_logs import crash_report, driver_temp_dir, worker_crashes

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


def test_a_crashed_drivers_session_is_found_by_its_pid_and_its_daemons_tails_reported(tmp_path):
    logs = tmp_path / "ray-abc" / "session_2026-12-06_03-05-40_1_4069" / "logs"
    logs.mkdir(parents=True)
    (tmp_path / "ray-abc" / "session_latest").symlink_to(logs.parent.name)
    (logs / "python-core-driver-01000000ffff_4069.log").write_text("")
    lines = [f"line {i}" for i in range(40)] + ["[state-dump] queue", "x" * 1000, "Check failed: agent died"]
    (logs / "raylet.out").write_text("\n".join(lines) + "\n")
    (logs / "gcs_server.err").write_text("")   # empty logs are left out
    (logs / "worker-1-ffff-42.err").write_text(REPORT)
    assert driver_temp_dir(tmp_path, 4068) is None
    session = driver_temp_dir(tmp_path, 4069)
    assert session == tmp_path / "ray-abc"
    report = crash_report(session)
    assert "--- raylet.out" in report and "Check failed: agent died" in report and "line 39" in report
    assert "line 10\n" not in report and "gcs_server.err" not in report and "x" * 241 not in report
    assert "state-dump" not in report
    assert "worker-1-ffff-42.err: Fatal Python error: Segmentation fault" in report
    assert crash_report(tmp_path / "nothing") == "(the session's logs say nothing)"


def test_a_crashed_commands_session_is_looked_for_where_ray_was_started(monkeypatch, tmp_path):
    from workers import ray_utils

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(ray_utils, "DEFAULT_TEMP_ROOT", ray_utils.Path("/r/.ray_tmp"))
    assert ray_utils.private_temp_root() == "/r/.ray_tmp"
    monkeypatch.setattr(ray_utils, "DEFAULT_TEMP_ROOT", tmp_path / ("deep" * 30))   # socket paths would not fit
    assert ray_utils.private_temp_root() == str(tmp_path)
