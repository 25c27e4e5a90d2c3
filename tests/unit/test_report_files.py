"""Report files (pr_rlhf.report_files): markdown, JSON and PNG written atomically, figures outside pyplot."""
import json
import math
import os
import sys

import numpy as np

from pr_rlhf.report_files import new_figure, write_json, write_report_files


def test_report_files_are_written_whole_and_readable_like_plain_files(tmp_path):
    fig = new_figure(figsize=(3, 2))
    fig.subplots().plot([0, 1], [0, 1])
    files = write_report_files(tmp_path / "out", "grid", markdown="# grid\n", data={"acc": 0.5}, figure=fig)
    assert files.markdown.read_text() == "# grid\n" and json.loads(files.json.read_text()) == {"acc": 0.5}
    assert files.figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["grid.json", "grid.md", "grid.png"]  # no temps
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert {p.stat().st_mode for p in (files.markdown, files.json, files.figure)} == {plain.stat().st_mode}
    only_md = write_report_files(tmp_path / "md", "bon", markdown="x\n")
    assert only_md.json is None and only_md.figure is None and os.listdir(tmp_path / "md") == ["bon.md"]


def test_figures_never_touch_pyplot():
    def open_figures():
        pyplot = sys.modules.get("matplotlib.pyplot")
        return None if pyplot is None else pyplot.get_fignums()

    before = open_figures()
    new_figure().subplots()
    assert open_figures() == before   # nothing registered with pyplot, so nothing left open


def test_strict_json_writes_null_for_nan_and_plain_numbers(tmp_path):
    data = {"a": float("nan"), "b": np.float32(0.25), "c": [np.int64(3), np.bool_(True), math.inf], 1: "k"}
    text = write_json(tmp_path / "m.json", data, indent=2, strict=True).read_text()
    assert json.loads(text) == {"a": None, "b": 0.25, "c": [3, True, None], "1": "k"} and text.endswith("}\n")
    loose = write_json(tmp_path / "l.json", {"a": float("nan")}).read_text()
    assert loose == '{\n "a": NaN\n}\n'
