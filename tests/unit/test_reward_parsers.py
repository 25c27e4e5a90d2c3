"""Parsers of model output: they never raise, and every failure is a typed error kind."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pr_rlhf.reward.judge import parse_verdict
from pr_rlhf.reward.parsing import ERROR_KINDS, Parsed, answer_text, strip_think, to_number
from pr_rlhf.reward.planner import parse_aspects
from pr_rlhf.reward.pointwise import parse_score
from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore, format_sec, normalize, parse_sec

PARSERS = {
    "verdict": parse_verdict,
    "score": parse_score,
    "aspects": parse_aspects,
    "sec": parse_sec,
    "sec_strict": lambda text: parse_sec(text, strict=True),
    "answer": answer_text,
}

FINAL_12 = "<final>{\"response_1\": 1, \"response_2\": 2}</final>"
REALISTIC_SEC = """<think>
The user picked short, practical answers before. Let me build the rubric.
</think>
Here is my evaluation.

<persona>
This user asks practical cooking questions and consistently prefers short, step-by-step answers
without anecdotes; they rejected long, chatty responses twice.
</persona>

<criteria>
The criteria below reflect the history.
1. **Brevity** | weight: 40 | stays short and to the point
2. Step-by-step structure | weight: 35% | numbered, actionable steps
3. No anecdotes | weight: 25 | skips personal stories
</criteria>

<scores>
1. Brevity | response_1: 8 | response_2: "3" | response 1 is half as long
2. Step-by-step structure | response_1: 9 | response_2: 4 | only response 1 numbers its steps
3. No anecdotes | response_1: "7.5" | response_2: 6 | response 2 opens with a story
</scores>

<final>
```json
{"response_1": "8.225", "response_2": 4.24}
```
</final>
"""


def _check(parsed: Parsed) -> None:
    assert isinstance(parsed, Parsed)
    if parsed.ok:
        assert parsed.value is not None
    else:
        assert parsed.error in ERROR_KINDS and parsed.error != "internal", parsed
        assert parsed.value is None or parsed.error == "tie"


# ----------------------------------------------------------------------------------------------------------------
# Fuzzing: random and adversarial text
# ----------------------------------------------------------------------------------------------------------------

FRAGMENTS = [
    "<think>", "</think>", "<THINK>", "</Think>", "Result: A", "Result: B", "**Result:** B", "Result:",
    "Result: A or B",
    "Score: 7", "Score: 1e999", "Score: nan", "Score: -inf", "Score: 11", "Score:", "1. ", "- ", "* ", "\n", "\n\n",
    "<persona>", "</persona>", "<criteria>", "</criteria>", "<scores>", "</scores>", "<final>", "</final>",
    "<final><final>", "</final></final>", "| weight: ", "| weight: 0", "| weight: -5", "| weight: NaN", "| weight: inf",
    "| weight: 1e309", "| weight: 40", " | response_1: ", "| response_2: ", "\"8\"", "'9'", "1e308",
    "99999999999999999999",
    "{", "}", "{}", "[]", "null", "true", "{\"response_1\": ", "\"response_2\"", ": ", ", ", "\"NaN\"", "Infinity",
    "{\"response_1\": \"x\", \"response_2\": [1]}", "{\"response_1\": 1e999, \"response_2\": 2}",
    "{\"response_1\": true, \"response_2\": false}", "better_response",
    "\"better_response\": {response_1: 7, response_2: '5'}",
    "[" * 50, "{\"a\":" * 30, "```json", "```", "é", "\u202e", "\u0000", "💥", "Ａ", "\u2028", "\r\n", " " * 40,
    "9" * 400,
]


@st.composite
def adversarial(draw) -> str:
    parts = draw(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=30)), max_size=40))
    return "".join(parts)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(), adversarial()))
def test_parsers_never_raise_and_return_typed_errors(name, text):
    _check(PARSERS[name](text))


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("bad", [None, 7, b"Result: A", ["Result: A"], {"x": 1}])
def test_parsers_survive_non_strings(name, bad):
    parsed = PARSERS[name](bad)
    _check(parsed)
    assert not parsed.ok


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_parsers_survive_huge_and_deep_inputs(name):
    for text in ["[" * 100_000, "{\"response_1\": " * 20_000, "<final>" + "[" * 50_000 + "</final>",
                 "<final>{\"response_1\": " + "9" * 5000 + ", \"response_2\": 1}</final>", "x" * 300_000,
                 "1. " + "a" * 200_000, ("Result: A\n" * 10_000) + "Result: B"]:
        _check(PARSERS[name](text))


# ----------------------------------------------------------------------------------------------------------------
# Think blocks and numbers
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("<think>hmm</think>Result: A", "Result: A"),
    ("<think>a</think> x <think>b</think>\n answer ", "answer"),
    ("reasoning in the prompt's think</think>final", "final"),
    ("<think>never closed Result: A", ""),
    ("<think>a</think> answer <think> more", ""),
    ("<THINK>x</Think>ok", "ok"),
    ("plain answer", "plain answer"),
])
def test_strip_think(text, expected):
    assert strip_think(text) == expected


def test_answer_text_kinds():
    assert answer_text("").error == "empty"
    assert answer_text("<think>forever").error == "unclosed_think"
    assert answer_text("<think>x</think>   ").error == "empty"
    assert answer_text("<think>x</think> yes").value == "yes"


@pytest.mark.parametrize("raw, expected", [
    (7, 7.0), ("7", 7.0), (" 7.5 ", 7.5), ("8/10", 8.0), ("40%", 40.0), ("**6**", 6.0), ("1e2", 100.0),
    (True, None), (None, None), ("nan", None), ("inf", None), ("1e999", None), (float("nan"), None), (10 ** 400, None),
    ("seven", None), ("", None), ("7 points", None), ([7], None),
])
def test_to_number(raw, expected):
    assert to_number(raw) == expected


# ----------------------------------------------------------------------------------------------------------------
# Verdicts
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value, error", [
    ("Answer B is more concise.\nResult: B", "B", None),
    ("result:a", "A", None),
    ("  RESULT :   b  ", "B", None),
    ("**Result:** B", "B", None),
    ("**Result: A**", "A", None),
    ("### Result: [B]", "B", None),
    ("Result: Answer A", "A", None),
    ("Result: A (it fits the user's love of detail)", "A", None),
    ("Final result: B.", "B", None),
    ("Result: B, a bit better", "B", None),
    ("Result: A - it is shorter", "A", None),
    ("**Result:**\n\nA", "A", None),
    ("Result: A\nOn reflection...\nResult: B", "B", None),           # the last result line decides
    ("<think>Result: A</think>Result: B", "B", None),
    ("<think>Result: A</think>", None, "empty"),
    ("<think>Result: A", None, "unclosed_think"),
    ("Result: A or B", None, "ambiguous"),
    ("Result: A/B", None, "ambiguous"),
    ("Result: A and B are both fine", None, "ambiguous"),
    ("Result: tie", None, "ambiguous"),
    ("Result: both", None, "ambiguous"),
    ("Result: a tie", None, "ambiguous"),
    ("Result: C", None, "no_verdict"),
    ("I prefer A.", None, "no_verdict"),
    ("The result: A", None, "no_verdict"),                          # not a result line: prose
    ("", None, "empty"),
])
def test_parse_verdict(text, value, error):
    parsed = parse_verdict(text)
    assert (parsed.value, parsed.error) == (value, error), parsed


# ----------------------------------------------------------------------------------------------------------------
# Pointwise scores and aspects
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value, error", [
    ("Fits well.\nScore: 8", 8.0, None),
    ("**Score:** 7.5", 7.5, None),
    ("Score: 9/10", 9.0, None),
    ("score = 3", 3.0, None),
    ("Score: 6\nScore: 2", 2.0, None),
    ("Score: 11", None, "bad_score"),
    ("Score: 0", None, "bad_score"),
    ("Score: 80/100", None, "bad_score"),
    ("Score: high", None, "bad_score"),
    ("Score: nan", None, "bad_score"),
    ("I'd give it an 8", None, "no_score"),
    ("<think>Score: 5", None, "unclosed_think"),
])
def test_parse_score(text, value, error):
    parsed = parse_score(text)
    assert (parsed.value, parsed.error) == (value, error), parsed


def test_parse_aspects_strips_dedupes_and_caps():
    text = ("Here is the plan:\n1. **Budget-friendly** options\n2) Budget-friendly options.\n- Vegetarian recipes\n"
            "* quick weeknight meals  \n• Vegetarian Recipes\n[6] Metric units\nnot a list line\n3.\n")
    parsed = parse_aspects(text)
    assert parsed.value == ["Budget-friendly options", "Vegetarian recipes", "quick weeknight meals", "Metric units"]
    assert parse_aspects(text, max_aspects=2).value == ["Budget-friendly options", "Vegetarian recipes"]
    assert parse_aspects("no list here").error == "no_aspects"
    assert parse_aspects("<think>1. a").error == "unclosed_think"


# ----------------------------------------------------------------------------------------------------------------
# SEC
# ----------------------------------------------------------------------------------------------------------------

def test_parse_realistic_chain_with_string_scores():
    parsed = parse_sec(REALISTIC_SEC, strict=True)
    assert parsed.ok, parsed
    sec = parsed.value
    assert sec.persona.startswith("This user asks practical cooking questions")
    assert [c.name for c in sec.criteria] == ["Brevity", "Step-by-step structure", "No anecdotes"]
    assert [c.weight for c in sec.criteria] == [0.4, 0.35, 0.25]
    assert sec.criteria[0].description == "stays short and to the point"
    assert [(s.response_1, s.response_2) for s in sec.scores] == [(8.0, 3.0), (9.0, 4.0), (7.5, 6.0)]
    assert sec.final == {"response_1": 8.225, "response_2": 4.24} and sec.final_source == "final"
    sums = sec.weighted_sums()
    assert sums["response_1"] == pytest.approx(0.4 * 8 + 0.35 * 9 + 0.25 * 7.5)


def test_weights_are_normalized():
    text = "<criteria>\n1. A | weight: 2\n2. B | weight: 6\n</criteria>\n" + FINAL_12
    sec = parse_sec(text).value
    assert [c.weight for c in sec.criteria] == [0.25, 0.75]
    loose = "<criteria>\n- Tone (weight: 30): warm\n- Depth - 70%\n</criteria>\n" + FINAL_12
    sec = parse_sec(loose).value
    assert [(c.name, c.weight) for c in sec.criteria] == [("Tone", 0.3), ("Depth", 0.7)]
    assert sec.criteria[0].description == "warm"


@given(st.lists(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False), min_size=1, max_size=8))
def test_normalize_sums_to_one_and_keeps_ratios(weights):
    out = normalize(weights)
    assert math.isclose(sum(out), 1.0, abs_tol=1e-8)
    assert all(w >= 0 for w in out)
    top = max(range(len(weights)), key=weights.__getitem__)
    assert out[top] == max(out)


@pytest.mark.parametrize("weight", ["0", "-10", "abc", "NaN", "inf", "1e999", ""])
def test_bad_weights(weight):
    text = f"<criteria>\n1. A | weight: {weight}\n2. B | weight: 50\n</criteria>\n" + FINAL_12
    assert parse_sec(text).error == "bad_weights"
    assert parse_sec("<criteria>\n1. Tone | warm tone\n</criteria>").error == "bad_weights"  # no weight at all


@pytest.mark.parametrize("score, error", [("11", "bad_score"), ("0", "bad_score"), ("\"x\"", "bad_score"),
                                          ("nan", "bad_score"), ("", "bad_score")])
def test_bad_criterion_scores(score, error):
    text = (f"<criteria>\n1. A | weight: 100\n</criteria>\n<scores>\n1. A | response_1: {score} | response_2: 5\n"
            f"</scores>\n<final>{{\"response_1\": 1, \"response_2\": 2}}</final>")
    assert parse_sec(text).error == error


@pytest.mark.parametrize("final, error", [
    ("{\"response_1\": 7}", "missing_scores"),
    ("[7, 5]", "no_json"),
    ("{\"response_1\": 7, \"response_2\": }", "bad_json"),
    ("{\"response_1\": \"NaN\", \"response_2\": 5}", "bad_score"),
    ("{\"response_1\": 1e999, \"response_2\": 5}", "bad_score"),
    ("{\"response_1\": true, \"response_2\": 5}", "bad_score"),
    ("{\"response_1\": [7], \"response_2\": 5}", "bad_score"),
    ("nothing here", "no_json"),
])
def test_bad_final_json(final, error):
    assert parse_sec(f"<final>{final}</final>").error == error


def test_final_variants():
    nested = parse_sec("<final><final>{\"response_1\": 3, \"response_2\": 4}</final></final>").value
    assert nested.final == {"response_1": 3.0, "response_2": 4.0}
    last = parse_sec("<final>{\"response_1\": 9, \"response_2\": 1}</final> wait "
                     "<final>{\"response_1\": 2, \"response_2\": 8}</final>")
    assert last.value.final == {"response_1": 2.0, "response_2": 8.0}
    unclosed = parse_sec("<final>\n{\"response_1\": \"6\", \"response_2\": \"7\"}")
    assert unclosed.value.final == {"response_1": 6.0, "response_2": 7.0}
    keyed = parse_sec("<final>{\"Response 1\": 6, \"response-2\": 7}</final>").value
    assert keyed.final == {"response_1": 6.0, "response_2": 7.0}
    wrapped = parse_sec("<final>{\"better_response\": {\"response_1\": 6, \"response_2\": 7}}</final>").value
    assert wrapped.final == {"response_1": 6.0, "response_2": 7.0}
    in_list = parse_sec("<final>[{\"response_1\": 7, \"response_2\": 5}]</final>").value  # first object wins
    assert in_list.final == {"response_1": 7.0, "response_2": 5.0}
    assert in_list.prefers_first is True and nested.prefers_first is False


def test_prefers_first_is_none_on_a_tie_or_a_missing_score():
    assert SEC("p", final={"response_1": 5.0, "response_2": 5.0}).prefers_first is None
    assert SEC("p", final={"response_1": 5.0}).prefers_first is None
    assert SEC("p").prefers_first is None


def test_public_better_response_shape():
    quoted = parse_sec('Analysis...\n```json\n{"better_response": {"response_1": "7", "response_2": 5.5}}\n```')
    assert quoted.value.final == {"response_1": 7.0, "response_2": 5.5}
    assert quoted.value.final_source == "better_response"
    loose = parse_sec("better_response: {response_1: 7, response_2: '5'}")
    assert loose.value.final == {"response_1": 7.0, "response_2": 5.0}


def test_final_recomputed_from_criteria():
    text = REALISTIC_SEC.split("<final>")[0]
    sec = parse_sec(text).value
    assert sec.final_source == "recomputed"
    assert sec.final["response_1"] == pytest.approx(0.4 * 8 + 0.35 * 9 + 0.25 * 7.5)
    assert sec.final["response_2"] == pytest.approx(0.4 * 3 + 0.35 * 4 + 0.25 * 6)
    assert parse_sec(text, strict=True).error == "missing_section"
    no_scores = text.split("<scores>")[0]
    assert parse_sec(no_scores).error == "missing_scores"
    assert parse_sec("Response 1 is better.").error == "no_json"


def test_strict_requires_every_part():
    no_persona = REALISTIC_SEC.replace("<persona>", "<p>").replace("</persona>", "</p>")
    assert parse_sec(no_persona, strict=True).error == "missing_section"
    assert parse_sec(no_persona).ok


_NAME = st.text(alphabet=st.characters(categories=["L", "N"], include_characters=" ,.'&?!-"), min_size=1, max_size=30) \
    .map(lambda s: " ".join(s.split())).filter(lambda s: s and s[0].isalpha())
_PROSE = st.text(alphabet=st.characters(categories=["L", "N", "Zs"], include_characters=",.'!?()-\n"), max_size=80) \
    .map(str.strip)
_SCORE = st.one_of(st.integers(1, 10).map(float), st.floats(1, 10, allow_nan=False))


@st.composite
def secs(draw) -> SEC:
    n = draw(st.integers(0, 5))
    names = draw(st.lists(_NAME, min_size=n, max_size=n, unique_by=str.casefold))
    weights = normalize(draw(st.lists(st.floats(0.5, 100), min_size=n, max_size=n))) if n else []
    describe = st.builds(lambda s: " ".join(s.split()), _PROSE)
    criteria = [Criterion(name, w, draw(describe)) for name, w in zip(names, weights)]
    scores = [CriterionScore(name, draw(_SCORE), draw(_SCORE), draw(describe)) for name in names]
    final = {"response_1": draw(st.floats(-100, 100)), "response_2": draw(st.floats(-100, 100))}
    persona = draw(_PROSE)
    return SEC(persona=persona, criteria=criteria, scores=scores, final=final, final_source="final")


@settings(max_examples=300, deadline=None)
@given(secs())
def test_format_then_parse_round_trips(sec):
    assume(all(not c.name[0].isdigit() for c in sec.criteria))
    parsed = parse_sec(format_sec(sec))
    assert parsed.ok, (parsed, format_sec(sec))
    assert parsed.value == sec


def test_format_of_a_parsed_chain_round_trips():
    sec = parse_sec(REALISTIC_SEC).value
    assert parse_sec(format_sec(sec)).value == sec
    assert parse_sec(format_sec(sec), strict=True).ok
