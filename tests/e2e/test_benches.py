"""Every row of the benchmark table in its --quick form, run as `make bench-quick` runs it (``bench/suite.py``, each
in its own process session): it must exit 0 and end with its ``BENCH`` line, its ratio and every numeric field a
finite number, so that a benchmark that crashes on a clean clone, or measures nothing (a nan), fails here. No
ratio's size is asserted: the --quick sizes check that a benchmark works, they measure nothing worth quoting."""
import math
import os

import pytest

from bench import common, suite

# a hang, not slowness: each --quick form takes seconds to about 1.5 min on an idle 2-core machine, and the slowest
# (scorers) passed 300 s on a 2-core machine loaded with other work beside the suite
HANG_TIMEOUT_S = 900


def number(value: str) -> float | None:
    """A field's value as a float when it is one (nan and inf included), else None."""
    try:
        return float(value)
    except ValueError:
        return None


CHECKED = [b for b in suite.BENCHES if b.quick_check]


@pytest.mark.timeout(HANG_TIMEOUT_S + 120)
@pytest.mark.parametrize("bench", CHECKED, ids=[b.row for b in CHECKED])
def test_quick_form_ends_with_its_bench_line(bench):
    outcome = suite.run_bench(bench, quick=True, hang_timeout_s=HANG_TIMEOUT_S)
    failure = outcome.failure(bench)
    assert failure is None, f"{failure}\n--- stdout\n{outcome.stdout[-3000:]}\n--- stderr\n{outcome.stderr[-5000:]}"
    fields = outcome.line["fields"]
    assert {"config", "baseline", "ours", "ratio"} <= set(fields), fields
    assert math.isfinite(float(fields["ratio"])) and float(fields["ratio"]) > 0, fields["ratio"]
    numbers = {k: number(v) for k, v in fields.items()}
    not_finite = {k: fields[k] for k, x in numbers.items() if x is not None and not math.isfinite(x)}
    assert not not_finite, f"numeric fields that are not finite: {not_finite}"
    if "--scorer" in bench.args:     # the row's own scorer measured (reward_service_load: pgenrm, then scalar)
        assert fields["scorer"] == bench.args[bench.args.index("--scorer") + 1], fields
    for key in ("wrong", "lost"):    # reward_service_load: every score compared with the one-at-a-time one
        if key in fields:
            assert numbers[key] == 0, fields
    if os.environ.get("PR_RLHF_ALL_EXTRAS") == "1":   # everything optional is installed: no part may fail
        failed = {k: v for k, v in fields.items() if v.startswith("failed:")}
        assert not failed, f"optional parts failed: {failed}\n--- stderr\n{outcome.stderr[-5000:]}"


def test_bench_line_reads_back_and_the_page_table_is_replaced(tmp_path):
    fields = {"n": 3, "grid": "failed:ValueError: no 'x'"}
    line = common.Result("demo", config="a | b", baseline="base: 2 s", ours="ours: 1 s", ratio=2.0,
                         fields=fields).line()
    assert common.last_bench_line(f"header\n{line}\n\n") == {"name": "demo", "fields": {
        "n": "3", "grid": "failed:ValueError: no 'x'", "config": "a | b", "baseline": "base: 2 s", "ours": "ours: 1 s",
        "ratio": "2.00"}}
    assert common.last_bench_line(f"{line}\nTraceback (most recent call last):") is None
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{suite.TABLE_BEGIN}\nold table\n{suite.TABLE_END}\nrest\n")
    suite.rewrite_table("| new |\n", readme)
    assert readme.read_text() == f"intro\n{suite.TABLE_BEGIN}\n| new |\n{suite.TABLE_END}\nrest\n"


@pytest.mark.parametrize("script, failed", [
    ("print('BENCH demo ratio=1.0')", False),
    ("print('BENCH demo ratio=1.0')\nprint('Traceback (most recent call last):')", True),   # not the last line
    ("print('BENCH demo ratio=1.0')\nraise SystemExit(1)", True),                           # a non-zero exit
    ("print('BENCH other ratio=1.0')", True),                                               # another bench's line
], ids=["ok", "not-last", "exit-1", "other-name"])
def test_a_run_fails_without_its_bench_line_or_on_an_error(tmp_path, script, failed):
    path = tmp_path / "demo.py"
    path.write_text(script + "\n")
    bench = suite.Bench("demo", str(path))
    outcome = suite.run_bench(bench, quick=True, hang_timeout_s=60)
    assert (outcome.failure(bench) is not None) == failed, outcome
