"""Prompt templates and the renderer: sections, placeholders, safe substitution, clear errors."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pr_rlhf import prompts
from pr_rlhf.prompts import PromptError, chat, fragment, names, placeholders, render, sections

PROMPT_DIR = Path(prompts.__file__).parent
EXPECTED = {
    "pairwise_judge": {"user_block", "conversation_block", "question", "answer_a", "answer_b"},
    "pointwise": {"user_block", "conversation_block", "question", "answer"},
    "sec": {"history_block", "stated_block", "user_block", "conversation_block", "question", "response_1",
            "response_2"},
    "planner": {"profile_block", "question"},
    "policy": {"profile_block", "plan_block", "question"},
    "rubric_judge": {"question", "aspects", "answer"},
    "rubric_judge_aspect": {"question", "narrative", "aspect", "reason", "evidence", "answer"},
    "scalar_rm": {"user_block", "conversation_block", "question"},
}


def _values(name: str, value: str = "x") -> dict:
    return {key: value for key in placeholders(name)}


def test_every_template_ships_as_package_data_and_loads():
    assert set(EXPECTED) | {"user_blocks"} <= set(names())
    for path in PROMPT_DIR.glob("*.txt"):  # setup.py ships prompts/*.txt
        assert path.stem in names()
    setup = (PROMPT_DIR.parents[1] / "setup.py").read_text()
    assert '"prompts/*.txt"' in setup


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_templates_have_system_and_user_parts_and_expected_placeholders(name):
    assert placeholders(name) == EXPECTED[name]
    messages = chat(name, **_values(name, "VALUE"))
    assert [m["role"] for m in messages][-1] == "user"
    assert all(m["content"].strip() for m in messages)
    assert "{" + "question" + "}" not in render(name, **_values(name, "VALUE"))
    if name != "scalar_rm":
        assert messages[0]["role"] == "system"


def test_verdict_and_score_instructions_match_the_parsers():
    judge = render("pairwise_judge", **_values("pairwise_judge"))
    assert "Result: A" in judge and "Result: B" in judge
    assert "Score: N" in render("pointwise", **_values("pointwise"))
    sec = sections("sec")["system"]
    for tag in ("<persona>", "</persona>", "<criteria>", "</criteria>", "<scores>", "</scores>", "<final>", "</final>"):
        assert tag in sec
    assert '{"response_1": F1, "response_2": F2}' in render("sec", **_values("sec"))  # JSON braces stay literal
    assert "100 words" in render("policy", profile_block="", plan_block="", question="q")


def test_missing_variable_is_a_clear_error():
    with pytest.raises(PromptError) as err:
        render("pairwise_judge", question="q", answer_a="a", answer_b="b", user_block="")
    message = str(err.value)
    assert "pairwise_judge" in message and "conversation_block" in message
    with pytest.raises(PromptError, match="no prompt template 'nope'"):
        render("nope")
    with pytest.raises(PromptError, match="no section"):
        fragment("user_blocks", "missing_section")
    with pytest.raises(PromptError):
        sections("../setup")


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text())
def test_values_are_never_interpreted(question, answer):
    q_value, a_value = question + "{answer}", answer + "{question} {{x}} $question %s {0}"
    text = render("pointwise", user_block="", conversation_block="", question=q_value, answer=a_value)
    assert q_value in text and a_value in text  # placeholder-looking text inside a value is left as written


def test_escaped_braces_and_empty_optional_lines():
    assert "{name}" in prompts._substitute("a {{name}} b", {}, "t")
    out = prompts._substitute("head\n{block}\n\nQuestion: {q}", {"block": "", "q": "why?"}, "t")
    assert out == "head\nQuestion: why?"
    out = prompts._substitute("head\n{block}\n\nQuestion: {q}", {"block": "B", "q": "why?"}, "t")
    assert out == "head\nB\n\nQuestion: why?"


def test_optional_blocks_leave_no_gaps():
    text = render("pairwise_judge", user_block="", conversation_block="", question="Q?", answer_a="a", answer_b="b")
    assert "\n\n\n" not in text
    user = chat("pairwise_judge", user_block="", conversation_block="", question="Q?", answer_a="a",
                answer_b="b")[-1]["content"]
    assert user.startswith("Question:\nQ?")


def test_policy_prompt_with_and_without_profile():
    from pr_rlhf.reward.inputs import profile_block

    posts = [{"id": "p1", "text": "I love slow mecha anime.", "category": "anime"}]
    with_profile = chat("policy", profile_block=profile_block(posts, 10), plan_block="",
                        question="What should I watch?")
    user = with_profile[-1]["content"]
    assert "Post 1 (Category: anime):\nI love slow mecha anime." in user
    assert user.index("Post 1") < user.index("What should I watch?")
    without = chat("policy", profile_block=profile_block([], 10), plan_block="",
                   question="What should I watch?")[-1]["content"]
    assert "Post" not in without and without.startswith("Question:")


def test_policy_prompt_with_plan_and_profile():
    from pr_rlhf.reward.inputs import plan_block, profile_block

    posts = [{"id": "p1", "text": "I love slow mecha anime.", "category": "anime"}]
    user = chat("policy", profile_block=profile_block(posts, 10), plan_block=plan_block(["Calm tone", "Lists"]),
                question="Q?")[-1]["content"]
    assert user.index("Post 1") < user.index("1. Calm tone") < user.index("2. Lists") < user.index("Question:\nQ?")
    assert "\n\n\n" not in user
    only_plan = chat("policy", profile_block="", plan_block=plan_block(["Calm tone"]), question="Q?")[-1]["content"]
    assert only_plan.startswith("What this user most likely expects") and "Post" not in only_plan
