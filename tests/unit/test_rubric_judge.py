"""Rubric downstream judge: the 0/1/2 parsers (never raise) and RubricJudge in both modes, on a scripted engine."""
from __future__ import annotations

import random
import string

import pytest

from pr_rlhf.models.base import Generation, Sample, SamplingParams
from pr_rlhf.records import RubricAspect
from pr_rlhf.reward.parsing import ERROR_KINDS
from pr_rlhf.reward.rubric_judge import (
    RubricAspectInput,
    RubricJudge,
    RubricVerdict,
    failure_counts,
    parse_aspect_score,
    parse_aspect_scores,
)


class ScriptedEngine:
    """Answers each prompt with the next canned output (a str, or a Generation as is); records every call."""

    name = "scripted"

    def __init__(self, outputs):
        self.outputs = list(outputs)
        self.calls: list[list] = []

    def generate(self, prompts, params):
        self.calls.append(list(prompts))
        out = []
        for _ in prompts:
            item = self.outputs.pop(0)
            out.append(item if isinstance(item, Generation) else Generation(samples=[Sample(text=item)]))
        return out

    def close(self):
        pass


def _content(prompt) -> str:
    return "\n".join(m["content"] for m in prompt)


def _check(parsed):
    assert parsed.error is None or (parsed.error in ERROR_KINDS and parsed.error != "internal"), parsed
    assert (parsed.value is None) == (parsed.error is not None), parsed


# ----------------------------------------------------------------------------------------------------------------
# parse_aspect_scores
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, n, expected", [
    ("Aspect 1: 2\nAspect 2: 1\nAspect 3: 0", 3, [2, 1, 0]),
    ("**Aspect 1:** 2\n**Aspect 2**: 1\n- aspect 3 = 0", 3, [2, 1, 0]),
    ("Aspect 1: 2/2\nAspect 2: 1/2", 2, [2, 1]),
    ("<think>Aspect 1: 0</think>\nAspect 1: 2", 1, [2]),
    ("Grades:\n### Aspect 1 (budget): **1**\n> Aspect 2: 2 (fully)\n", 2, [1, 2]),
    ("Aspect 1: 0\nAspect 2: 2\nAspect 1: 2", 2, [2, 2]),               # repeated index: the last wins
    ("Aspect 1: 3\nAspect 1: 1", 1, [1]),                               # ... even over a bad earlier line
    ("Aspect 0: 2\nAspect 1: 1\nAspect 4: 9\nAspect 99999999999: 2", 1, [1]),   # out of range: ignored
    ("Aspect 1: 2.0", 1, [2]),
])
def test_parse_aspect_scores_valid(text, n, expected):
    parsed = parse_aspect_scores(text, n)
    assert parsed.ok, parsed
    assert parsed.value == expected


@pytest.mark.parametrize("text, n, error", [
    ("Aspect 1: 2\nAspect 2: 1", 3, "missing_scores"),
    ("Aspect 2: 1", 3, "missing_scores"),
    ("Aspect 1: 3", 1, "bad_score"),
    ("Aspect 1: 1.5", 1, "bad_score"),
    ("Aspect 1: high", 1, "bad_score"),
    ("Aspect 1: -1", 1, "bad_score"),
    ("Aspect 1: 2/10", 1, "bad_score"),
    ("Aspect 1:", 1, "bad_score"),
    ("Aspect 1: 2\nAspect 2: 1\nAspect 2: 7", 2, "bad_score"),
    ("The answer is good.", 2, "no_score"),
    ("Aspect 5: 2", 2, "no_score"),
    ("", 2, "empty"),
    ("   \n ", 2, "empty"),
    ("<think>Aspect 1: 2</think>", 1, "empty"),
    ("<think>Aspect 1: 2", 1, "unclosed_think"),
])
def test_parse_aspect_scores_failures(text, n, error):
    parsed = parse_aspect_scores(text, n)
    assert parsed.error == error, parsed
    assert parsed.value is None


def test_missing_scores_names_the_missing_indices():
    parsed = parse_aspect_scores("Aspect 2: 1\nAspect 4: 2", 5)
    assert parsed.error == "missing_scores"
    assert "1, 3, 5" in parsed.message


# ----------------------------------------------------------------------------------------------------------------
# parse_aspect_score
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("It covers the budget well.\nScore: 2", 2),
    ("Partly.\n**Score:** 1", 1),
    ("Score: 2/2", 2),
    ("Score: 0", 0),
    ("Score: 1\nOn reflection...\nFinal score: 2", 2),          # the last line wins
    ("<think>Score: 0</think>Fine.\nscore = 1", 1),
])
def test_parse_aspect_score_valid(text, expected):
    parsed = parse_aspect_score(text)
    assert parsed.ok, parsed
    assert parsed.value == expected


@pytest.mark.parametrize("text, error", [
    ("Score: 3", "bad_score"),
    ("Score: 1.5", "bad_score"),
    ("Score: high", "bad_score"),
    ("Score: 7/10", "bad_score"),
    ("Score: 2\nScore: 5", "bad_score"),
    ("The answer is fine.", "no_score"),
    ("", "empty"),
    ("<think>Score: 2", "unclosed_think"),
    ("<think>x</think>  ", "empty"),
])
def test_parse_aspect_score_failures(text, error):
    parsed = parse_aspect_score(text)
    assert parsed.error == error, parsed


# ----------------------------------------------------------------------------------------------------------------
# Fuzz: junk and truncated outputs never raise, never hit "internal"
# ----------------------------------------------------------------------------------------------------------------

_VALID = ["<think>weighing it</think>\n**Aspect 1:** 2\nAspect 2 = 1/2\nAspect 3: 0\n",
          "The answer mentions the budget.\nScore: 2", "Aspect 1: 1\nAspect 2: 2\nScore: 1/2"]
_FRAGMENTS = ["Aspect ", "aspect", "Score:", "**", ": ", " = ", "/2", "/", "1", "2", "3", "1.5", "-", "\n", "<think>",
              "</think>", "9" * 400, "1e999", "nan", "(", ")", "é", "\u0000", "💥", "\u2028", "\r\n", "#", "`"]


def _junk(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(120)))
    if kind == 1:
        valid = rng.choice(_VALID)
        return valid[:rng.randrange(len(valid) + 1)]
    return "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randrange(40)))


def test_parsers_never_raise_on_junk():
    rng = random.Random(0)
    for _ in range(300):
        text = _junk(rng)
        _check(parse_aspect_scores(text, rng.randint(1, 4)))
        _check(parse_aspect_score(text))
    for bad in (None, 7, b"Score: 2", ["Aspect 1: 2"]):
        assert parse_aspect_score(bad).error == "empty"
        assert parse_aspect_scores(bad, 1).error == "empty"
    _check(parse_aspect_scores("Aspect " + "9" * 5000 + ": 2\n" + "Aspect 1: 2\n" * 2000, 1))


# ----------------------------------------------------------------------------------------------------------------
# RubricJudge
# ----------------------------------------------------------------------------------------------------------------

PARAMS = SamplingParams(max_tokens=64)
QUESTIONS = ["How do I plan a trip to Japan?", "Which laptop should I buy?", "How to learn the piano?"]
ANSWERS = ["Go in spring, rail pass.", "A light one with long battery.", "Practice daily with a teacher."]
RUBRICS = [
    [RubricAspectInput("mentions a budget", "they are a student", "I only have $800"),
     RubricAspectInput("suggests cherry blossoms", "they love flowers", "I grow roses"),
     RubricAspectInput("covers rail passes")],
    [RubricAspectInput("battery life", "travels a lot", "I fly weekly")],
    [RubricAspectInput("adult learner", "they are 50", "at my age"), RubricAspectInput("cheap options")],
]


def test_all_mode_one_call_and_normalized_scores():
    engine = ScriptedEngine(["Aspect 1: 2\nAspect 2: 1\nAspect 3: 0", "**Aspect 1:** 2", "Aspect 1: 1\nAspect 2: 2"])
    verdicts = RubricJudge(engine, params=PARAMS).judge(QUESTIONS, ANSWERS, RUBRICS)
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 3
    for prompt, question, answer, rubric in zip(engine.calls[0], QUESTIONS, ANSWERS, RUBRICS):
        text = _content(prompt)
        assert question in text and answer in text
        for k, a in enumerate(rubric, 1):
            assert f"{k}. {a.aspect}" in text
    assert [v.score for v in verdicts] == [0.5, 1.0, 0.75]
    assert [v.aspect_scores for v in verdicts] == [[2, 1, 0], [2], [1, 2]]
    assert all(v.ok for v in verdicts) and failure_counts(verdicts) == {}


def test_all_mode_failures_are_typed():
    engine = ScriptedEngine(["Aspect 1: 2\nAspect 2: 1", Generation(error="timeout"), Generation(samples=[])])
    verdicts = RubricJudge(engine, params=PARAMS, mode="all").judge(QUESTIONS, ANSWERS, RUBRICS)
    assert [(v.score, v.aspect_scores, v.error) for v in verdicts] == [
        (None, None, "missing_scores"), (None, None, "engine_error"), (None, None, "empty")]
    assert "3" in verdicts[0].message
    assert failure_counts(verdicts) == {"missing_scores": 1, "engine_error": 1, "empty": 1}


def test_per_aspect_mode_one_call_one_prompt_per_aspect():
    engine = ScriptedEngine(["Meets it.\nScore: 2", "Partly.\n**Score:** 1", "Score: 0",
                             "Score: 2/2",
                             "Score: 1", "Score: 1"])
    narratives = ["I am a student saving for Japan.", "I travel for work.", "I am 50 and want to start piano."]
    verdicts = RubricJudge(engine, params=PARAMS, mode="per_aspect").judge(QUESTIONS, ANSWERS, RUBRICS, narratives)
    assert len(engine.calls) == 1 and len(engine.calls[0]) == sum(map(len, RUBRICS)) == 6
    first = _content(engine.calls[0][0])
    for piece in (QUESTIONS[0], narratives[0], "mentions a budget", "they are a student", "I only have $800",
                  ANSWERS[0]):
        assert piece in first
    assert "suggests cherry blossoms" not in first
    assert "(not given)" in _content(engine.calls[0][2])       # the third aspect has no reason or evidence
    assert narratives[2] in _content(engine.calls[0][4]) and "cheap options" in _content(engine.calls[0][5])
    assert [v.score for v in verdicts] == [0.5, 1.0, 0.5]
    assert [v.aspect_scores for v in verdicts] == [[2, 1, 0], [2], [1, 1]]


def test_per_aspect_one_bad_aspect_fails_the_answer_and_empty_rubric_sends_nothing():
    engine = ScriptedEngine(["Score: 2", "Score: high", "Score: 2", "Score: 1"])
    rubrics = [RUBRICS[0], [], [RubricAspect(aspect="from records", evidence="ev", reason="why")]]
    verdicts = RubricJudge(engine, params=PARAMS, mode="per_aspect").judge(QUESTIONS, ANSWERS, rubrics)
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 4
    assert not any(ANSWERS[1] in _content(p) for p in engine.calls[0])
    assert verdicts[0] == RubricVerdict(None, None, "bad_score", verdicts[0].message)
    assert verdicts[0].message.startswith("aspect 2:")
    assert verdicts[1] == RubricVerdict(None, None, "no_aspects", "no rubric aspects for this query")
    assert verdicts[2].score == 0.5 and verdicts[2].aspect_scores == [1]
    assert "from records" in _content(engine.calls[0][3]) and "why" in _content(engine.calls[0][3])


def test_per_aspect_engine_error_fails_the_answer():
    engine = ScriptedEngine(["Score: 2", Generation(error="boom")])
    verdicts = RubricJudge(engine, params=PARAMS, mode="per_aspect").judge(
        QUESTIONS[:1], ANSWERS[:1], [RUBRICS[0][:2]])
    assert verdicts[0].error == "engine_error" and verdicts[0].score is None
    assert verdicts[0].message.startswith("aspect 2:")


def test_all_empty_rubrics_call_no_engine():
    engine = ScriptedEngine([])
    verdicts = RubricJudge(engine, params=PARAMS).judge(QUESTIONS[:2], ANSWERS[:2], [[], []])
    assert engine.calls == []
    assert failure_counts(verdicts) == {"no_aspects": 2}
    assert RubricJudge(engine, params=PARAMS).judge([], [], []) == []


@pytest.mark.parametrize("mode", ["all", "per_aspect"])
def test_length_mismatch_is_a_caller_error(mode):
    judge = RubricJudge(ScriptedEngine([]), params=PARAMS, mode=mode)
    with pytest.raises(ValueError, match="must match"):
        judge.judge(QUESTIONS, ANSWERS[:2], RUBRICS)
    with pytest.raises(ValueError, match="must match"):
        judge.judge(QUESTIONS, ANSWERS, RUBRICS[:1])
    with pytest.raises(ValueError, match="narratives"):
        judge.judge(QUESTIONS, ANSWERS, RUBRICS, narratives=["x"])


def test_unknown_mode_and_short_engine_reply():
    with pytest.raises(ValueError, match="mode"):
        RubricJudge(ScriptedEngine([]), params=PARAMS, mode="pairwise")  # type: ignore[arg-type]

    class Short(ScriptedEngine):
        def generate(self, prompts, params):
            return []

    with pytest.raises(RuntimeError, match="generations"):
        RubricJudge(Short([]), params=PARAMS).judge(QUESTIONS[:1], ANSWERS[:1], RUBRICS[:1])
