"""Every number in a results block of README.md or of a documentation page comes from the committed file the block
names, so a rerun that changes a result cannot leave a stale number behind.

A results block is marked in the page:

    <!-- numbers: docs/results/x/report.json docs/results/x/analysis.md -->
    ... tables and sentences ...
    <!-- /numbers -->

Every number in it (outside inline code) must appear in one of the named files, as written or rounded, as a
fraction shown in percent or points (x 100), or as seconds shown in minutes (/ 60). And no 95% CI (`[a, b]`)
appears outside a results block of a hand-written page: a CI is a result. The files under docs/results/ are the
studies' committed files (reports, pre-registrations): backing files, not prose, so the CI rule leaves them out.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
OPEN = re.compile(r"<!-- numbers: (?P<files>[^>]*?) -->")
CLOSE = "<!-- /numbers -->"
# a number not glued to a word (u0001, SmolLM2-135M, 8B, x1) or to a path or version (0.32.0)
NUMBER = re.compile(r"(?<![\w.\-/])[+\-\u2212]?\d[\d,]*(?:\.\d+)?(?![\w.]*\w)")
# in a backing file any number counts, with its unit glued on or not (612.42s, 87.5%)
FILE_NUMBER = re.compile(r"[+\-\u2212]?\d[\d,]*(?:\.\d+)?")
CI = re.compile(r"\[[+\-\u2212]?\d+\.\d+%?, [+\-\u2212]?\d+\.\d+%?\]")
CODE = re.compile(r"`[^`]*`")
CI_LEVEL = re.compile(r"95% (?=CI|bootstrap|percentile)")   # the CI's level is a convention, not a result


def documentation_pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (the studies' files under docs/results/ included)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def is_backing_file(page: Path) -> bool:
    """A study's committed file (docs/results/): what results blocks cite, not prose that quotes results."""
    return RESULTS in page.parents


def where(page: Path, line: int, root: Path = ROOT) -> str:
    return f"{page.relative_to(root)}:{line}"


def blocks(text: str, page: Path = README) -> list[tuple[int, list[str], str, int, int]]:
    """(line number, backing files, block text, start, end offsets of the text) of every results block."""
    out = []
    for m in OPEN.finditer(text):
        line = text[:m.start()].count("\n") + 1
        end = text.find(CLOSE, m.end())
        assert end > 0, f"{where(page, line)}: a results block is never closed"
        out.append((line, m.group("files").split(), text[m.end():end], m.end(), end))
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


def unbacked_numbers(page: Path) -> list[str]:
    """One problem per results block of ``page`` holding a number its backing files do not."""
    problems = []
    for line, files, body, _, _ in blocks(page.read_text(), page):
        missing = [f for f in files if not (ROOT / f).is_file()]
        assert not missing, f"{where(page, line)}: backing files not committed: {missing}"
        numbers = set().union(*(file_numbers(ROOT / f) for f in files))
        prose = CI_LEVEL.sub(" ", CODE.sub(" ", body))
        unbacked = [t for t in NUMBER.findall(prose) if not backed(t, numbers)]
        if unbacked:
            problems.append(f"{where(page, line)} ({', '.join(files)}): {sorted(set(unbacked))[:12]}")
    return problems


def stray_intervals(page: Path, root: Path = ROOT) -> list[str]:
    """``page:line: [a, b]`` for every CI outside the page's results blocks and inline code."""
    text = page.read_text()
    for _, _, _, start, end in reversed(blocks(text, page)):   # blank the blocks, keep the line numbers
        text = text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]
    text = CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return [f"{where(page, text[:m.start()].count(chr(10)) + 1, root)}: {m.group(0)}" for m in CI.finditer(text)]


PAGES = documentation_pages()
PROSE = [p for p in PAGES if not is_backing_file(p)]


def test_the_pages_are_found():
    names = {str(p.relative_to(ROOT)) for p in PROSE}
    assert {"README.md", "docs/getting-started.md", "docs/studies/pgenrm-worlds.md", "docs/protocols.md"} <= names
    assert len(PROSE) >= 25, names
    assert any(is_backing_file(p) for p in PAGES) and not is_backing_file(README)


def test_every_number_of_a_results_block_is_in_its_backing_files():
    found = {page: blocks(page.read_text(), page) for page in PAGES}
    assert sum(len(b) for b in found.values()) >= 25, "the results pages name their backing files"
    assert len(found[README]) >= 2, "the README's output and results tables name their backing files"
    problems = [p for page in PAGES for p in unbacked_numbers(page)]
    assert not problems, "numbers with no backing:\n" + "\n".join(problems)


def test_no_confidence_interval_outside_a_results_block():
    stray = [s for page in PROSE for s in stray_intervals(page)]
    assert not stray, "CIs outside any results block:\n" + "\n".join(stray[:20])


def test_a_stray_interval_is_named_by_page_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- numbers: a.json -->\n+1.0 [0.5, 1.5]\n<!-- /numbers -->\nsaid +2.0 [1.0, 3.0]\n"
                    "`code [1.0, 2.0]`\n")
    assert stray_intervals(page, root=tmp_path) == ["page.md:5: [1.0, 3.0]"]


@pytest.mark.parametrize("token,numbers,ok", [
    ("+4.1", {0.04123}, True), ("87.7", {0.8771}, True), ("12.3", {738.0}, True), ("1,200", {1200}, True),
    ("-0.7", {-0.0068}, True), ("4.1", {0.039}, False), ("71.7", {0.70}, False)])
def test_backing_rules(token, numbers, ok):
    assert backed(token, numbers) is ok
