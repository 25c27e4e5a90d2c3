"""Every number in the README's results blocks comes from the committed file the block names, so a rerun that
changes a result cannot leave a stale number behind.

A results block is marked in README.md:

    <!-- numbers: docs/results/x/report.json docs/results/x/analysis.md -->
    ... tables and sentences ...
    <!-- /numbers -->

Every number in it (outside inline code) must appear in one of the named files, as written or rounded, as a
fraction shown in percent or points (x 100), or as seconds shown in minutes (/ 60). And no 95% CI (`[a, b]`)
appears outside a results block: a CI is a result.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
OPEN = re.compile(r"<!-- numbers: (?P<files>[^>]*?) -->")
CLOSE = "<!-- /numbers -->"
# a number not glued to a word (u0001, SmolLM2-135M, 8B, x1) or to a path or version (0.32.0)
NUMBER = re.compile(r"(?<![\w.\-/])[+\-\u2212]?\d[\d,]*(?:\.\d+)?(?![\w.]*\w)")
# in a backing file any number counts, with its unit glued on or not (612.42s, 87.5%)
FILE_NUMBER = re.compile(r"[+\-\u2212]?\d[\d,]*(?:\.\d+)?")
CI = re.compile(r"\[[+\-\u2212]?\d+\.\d+%?, [+\-\u2212]?\d+\.\d+%?\]")
CODE = re.compile(r"`[^`]*`")
CI_LEVEL = re.compile(r"95% (?=CI|bootstrap|percentile)")   # the CI's level is a convention, not a result


def blocks(text: str) -> list[tuple[int, list[str], str]]:
    """(line number, backing files, block text) of every results block."""
    out = []
    for m in OPEN.finditer(text):
        end = text.find(CLOSE, m.end())
        assert end > 0, f"README.md line {text[:m.start()].count(chr(10)) + 1}: a results block is never closed"
        out.append((text[:m.start()].count("\n") + 1, m.group("files").split(), text[m.end():end]))
    return out


def file_numbers(path: Path) -> set[float]:
    """Every number a backing file holds: JSON (or JSON-lines) numbers and the numbers inside its strings, or the
    numbers of a text file."""
    text = path.read_text()
    if path.suffix == ".json":
        return _numbers_of(json.loads(text))
    if path.suffix == ".jsonl":
        return _numbers_of([json.loads(line) for line in text.splitlines() if line.strip()])
    return {_parse(t) for t in FILE_NUMBER.findall(text)}


def _numbers_of(node) -> set[float]:
    if isinstance(node, bool) or node is None:
        return set()
    if isinstance(node, (int, float)):
        return {float(node)}
    if isinstance(node, str):
        return {_parse(t) for t in FILE_NUMBER.findall(node)}
    items = [*node.keys(), *node.values()] if isinstance(node, dict) else list(node)
    return set().union(*(_numbers_of(x) for x in items)) if items else set()


def _parse(token: str) -> float:
    return float(token.replace(",", "").replace("\u2212", "-").lstrip("+"))


def backed(token: str, numbers: set[float]) -> bool:
    value = _parse(token)
    decimals = len(token.split(".")[1]) if "." in token else 0
    tol = 0.5 * 10 ** -decimals + 1e-9
    for y in numbers:
        for candidate in (y, 100 * y, y / 60):
            if abs(candidate - value) <= tol or abs(-candidate - value) <= tol and token[0] in "-\u2212":
                return True
    return False


def test_every_number_of_a_results_block_is_in_its_backing_files():
    text = README.read_text()
    found = blocks(text)
    assert len(found) >= 10, "the README's results sections name their backing files"
    problems = []
    for line, files, body in found:
        missing = [f for f in files if not (ROOT / f).is_file()]
        assert not missing, f"README.md line {line}: backing files not committed: {missing}"
        numbers = set().union(*(file_numbers(ROOT / f) for f in files))
        prose = CI_LEVEL.sub(" ", CODE.sub(" ", body))
        unbacked = [t for t in NUMBER.findall(prose) if not backed(t, numbers)]
        if unbacked:
            problems.append(f"README.md line {line} ({', '.join(files)}): {sorted(set(unbacked))[:12]}")
    assert not problems, "numbers with no backing:\n" + "\n".join(problems)


def test_no_confidence_interval_outside_a_results_block():
    text = README.read_text()
    for _, _, body in blocks(text):
        text = text.replace(body, "")
    stray = [m.group(0) for m in CI.finditer(CODE.sub(" ", text))]
    assert not stray, f"CIs outside any results block: {stray[:10]}"


@pytest.mark.parametrize("token,numbers,ok", [
    ("+4.1", {0.04123}, True), ("87.7", {0.8771}, True), ("12.3", {738.0}, True), ("1,200", {1200}, True),
    ("-0.7", {-0.0068}, True), ("4.1", {0.039}, False), ("71.7", {0.70}, False)])
def test_backing_rules(token, numbers, ok):
    assert backed(token, numbers) is ok
