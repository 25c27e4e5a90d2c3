"""Reward models: RM inputs from shard rows, user blocks, slot randomization, the pairwise / SEC / pointwise judges
and the planner (scripted fake engine for the logic, the real tiny model for the plumbing), and the scalar RM."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest

from pr_rlhf.models.base import Generation, Sample, SamplingParams
from pr_rlhf.records import History, Pair, Profile
from pr_rlhf.reward.inputs import (
    RMInput,
    conversation_block,
    history_block,
    history_rows_by_user,
    rm_inputs_from_rows,
    user_block,
    with_plans,
)
from pr_rlhf.reward.judge import JudgeVerdict, PairwiseJudge, chosen_slot
from pr_rlhf.reward.parsing import ERROR_KINDS
from pr_rlhf.reward.planner import Planner
from pr_rlhf.reward.pointwise import PointwiseJudge
from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore, format_sec
from pr_rlhf.shards import ShardReader, write_shards

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
POSTS = [{"id": f"p{i}", "text": f"post number {i} about slow cooking", "category": ("cooking", "anime")[i % 2],
          "score": 1.0 - i / 10} for i in range(12)]


def make_input(pair_id: str = "q1", **kw) -> RMInput:
    base = dict(pair_id=pair_id, user_id="u1", subset="S", question="How do I cook rice?", chosen="CHOSEN answer",
                rejected="REJECTED answer", context=[{"role": "user", "content": "How do I cook rice?"}],
                retrieved=POSTS, history=[{"question": "Best pan?", "chosen": "Cast iron.", "rejected": "Any."}],
                stated_preferences="I like short answers.")
    base.update(kw)
    return RMInput(**base)


class FakeEngine:
    """Returns scripted texts: ``script(prompt_text) -> str | None`` (None = an engine error for that prompt)."""

    name = "fake"

    def __init__(self, script):
        self.script = script
        self.prompts: list = []

    def generate(self, prompts, params):
        self.prompts += prompts
        out = []
        for prompt in prompts:
            text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
            reply = self.script(text)
            out.append(Generation(error="boom: timeout") if reply is None else Generation(samples=[Sample(text=reply)]))
        return out

    def score_continuations(self, prefix, continuations):  # pragma: no cover - not used here
        raise NotImplementedError

    def close(self):
        pass


def slot_of_chosen(prompt_text: str) -> str:
    """Which slot the scripted engine sees the chosen answer in (judge and SEC prompts)."""
    a = prompt_text.index("CHOSEN")
    b = prompt_text.index("REJECTED")
    return "A" if a < b else "B"


# ----------------------------------------------------------------------------------------------------------------
# Inputs and blocks
# ----------------------------------------------------------------------------------------------------------------

def _tables():
    pairs, histories, profiles = [], [], []
    for u in ("u1", "u2"):
        ids = []
        for k in range(5):
            pid = f"{u}_{k}"
            split = "train" if k < 4 else "test"
            pairs.append(Pair(pair_id=pid, query_id=pid, user_id=u, source="t", subset="S", split=split,
                              question=f"{u} question {k}?", chosen=f"{u} chosen {k}", rejected=f"{u} rejected {k}",
                              context=[{"role": "user", "content": f"{u} question {k}?"}], retrieved=POSTS[:3],
                              meta='{"secret": "never shown"}'))
            if split == "train":
                ids.append(pid)
        histories.append(History(user_id=u, source="t", subset="S", pair_ids=ids))
        profiles.append(Profile(user_id=u, source="t", subset="S", items=[], stated_preferences=f"{u} likes lists"))
    return {"pairs": pairs, "histories": histories, "profiles": profiles, "queries": [], "rubrics": []}


def test_rm_inputs_from_shard_rows_exclude_the_evaluated_pair(tmp_path):
    write_shards(tmp_path, _tables(), source="t", config={})
    reader = ShardReader(tmp_path)
    pair_rows = list(reader.iter_rows("pairs"))
    by_user = history_rows_by_user(reader.iter_rows("histories"), pair_rows)
    profiles = {(r["user_id"], r["subset"]): r for r in reader.iter_rows("profiles")}
    inputs = {i.pair_id: i for i in rm_inputs_from_rows(pair_rows, by_user, profiles, k=3)}
    test_input = inputs["u1_4"]
    assert [h["question"] for h in test_input.history] == ["u1 question 0?", "u1 question 1?", "u1 question 2?"]
    assert test_input.stated_preferences == "u1 likes lists"
    assert [p["id"] for p in test_input.retrieved] == ["p0", "p1", "p2"]
    # A train pair evaluated on its own: it never appears in its own history; the next one fills the slot.
    train_input = inputs["u1_1"]
    assert [h["question"] for h in train_input.history] == ["u1 question 0?", "u1 question 2?", "u1 question 3?"]
    assert all(h["question"].startswith("u2") for h in inputs["u2_0"].history)
    assert not hasattr(test_input, "meta") and not hasattr(test_input, "rubric")
    assert rm_inputs_from_rows(pair_rows[:1], by_user, profiles, k=0)[0].history == []
    # plain user_id keys and missing users work too
    lone = rm_inputs_from_rows([{"pair_id": "x", "user_id": "nobody", "question": "q", "chosen": "c",
                                 "rejected": "r"}], {}, None, k=3)[0]
    assert lone.history == [] and lone.stated_preferences == "" and lone.retrieved == []


def test_user_block_modes():
    inp = make_input()
    assert user_block(inp, "none", 10) == ""
    profile = user_block(inp, "profile", 3)
    assert "Post 1 (Category: cooking):\npost number 0 about slow cooking" in profile
    assert "Post 3 (Category: cooking):" in profile and "Post 4" not in profile
    assert user_block(replace(inp, retrieved=[]), "profile", 3) == ""
    with pytest.raises(ValueError, match="plan"):
        user_block(inp, "plan", 3)
    planned = with_plans([inp], [["Short answers", "Metric units"]])[0]
    assert user_block(planned, "plan", 3).endswith("1. Short answers\n2. Metric units")
    assert user_block(replace(inp, plan=[]), "plan", 3) == ""
    with pytest.raises(ValueError, match="unknown input mode"):
        user_block(inp, "rubric", 3)  # type: ignore[arg-type]


def test_history_and_conversation_blocks():
    inp = make_input(history=[{"question": f"q{i}", "chosen": f"c{i}", "rejected": f"r{i}"} for i in range(4)])
    block = history_block(inp, 2)
    assert "Example 1\nUser: q0\nChosen: c0\nRejected: r0" in block and "Example 2" in block and "q2" not in block
    assert history_block(replace(inp, history=[])) == ""
    assert conversation_block(inp) == ""  # the only turn is the question itself
    multi = make_input(context=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                                {"role": "user", "content": "How do I cook rice?"}])
    assert conversation_block(multi).endswith("User: hi\nAssistant: hello")


# ----------------------------------------------------------------------------------------------------------------
# Slot randomization
# ----------------------------------------------------------------------------------------------------------------

def test_chosen_slot_is_deterministic_and_balanced():
    n = 4000
    slots = [chosen_slot(7, f"pair-{i}") for i in range(n)]
    assert slots == [chosen_slot(7, f"pair-{i}") for i in range(n)]
    count_a = Counter(slots)["A"]
    assert abs(count_a - n / 2) <= 4 * math.sqrt(n) / 2  # 4 standard deviations of Binomial(n, 1/2)
    other_seed = [chosen_slot(8, f"pair-{i}") for i in range(n)]
    agree = sum(a == b for a, b in zip(slots, other_seed))
    assert abs(agree - n / 2) <= 4 * math.sqrt(n) / 2  # a new seed is a fresh coin


# ----------------------------------------------------------------------------------------------------------------
# Judges on a scripted engine
# ----------------------------------------------------------------------------------------------------------------

def test_pairwise_judge_maps_slots_and_counts_failures():
    inputs = [make_input(f"q{i}") for i in range(40)]
    right = FakeEngine(lambda t: f"Thinking...\nResult: {slot_of_chosen(t)}")
    always_right = PairwiseJudge(right, params=GREEDY, seed=3)
    verdicts = always_right.judge(inputs, "profile", 5)
    assert all(v.correct for v in verdicts) and {v.chosen_slot for v in verdicts} == {"A", "B"}
    assert [v.chosen_slot for v in verdicts] == [chosen_slot(3, i.pair_id) for i in inputs]
    always_a = PairwiseJudge(FakeEngine(lambda t: "Result: A"), params=GREEDY, seed=3).judge(inputs, "none", 5)
    assert sum(v.correct for v in always_a) == sum(v.chosen_slot == "A" for v in always_a)
    garbage = PairwiseJudge(FakeEngine(lambda t: "I cannot decide."), params=GREEDY, seed=3).judge(inputs, "none", 5)
    assert all(v.error == "no_verdict" and not v.correct and v.predicted is None for v in garbage)
    failed = PairwiseJudge(FakeEngine(lambda t: None), params=GREEDY, seed=3).judge(inputs[:2], "none", 5)
    assert [v.error for v in failed] == ["engine_error", "engine_error"] and not any(v.correct for v in failed)


def test_both_orders_gives_two_opposite_verdicts_per_pair():
    engine = FakeEngine(lambda t: "Result: A")
    verdicts = PairwiseJudge(engine, params=GREEDY, seed=0).judge([make_input("x"), make_input("y")], "none", 5,
                                                                  both_orders=True)
    assert [v.pair_id for v in verdicts] == ["x", "x", "y", "y"]
    assert {verdicts[0].chosen_slot, verdicts[1].chosen_slot} == {"A", "B"}
    assert sum(v.correct for v in verdicts) == 2  # a judge that always says A is right exactly once per pair
    assert [slot_of_chosen("\n".join(m["content"] for m in p)) for p in engine.prompts] == \
        [v.chosen_slot for v in verdicts]


def test_judge_prompt_shows_only_what_the_mode_allows():
    engine = FakeEngine(lambda t: "Result: A")
    judge = PairwiseJudge(engine, params=GREEDY, seed=0)
    inp = replace(make_input(), plan=["Keep it short"])
    for mode, present, absent in (("none", [], ["Post 1", "Keep it short"]),
                                  ("profile", ["Post 1 (Category: cooking):"], ["Keep it short"]),
                                  ("plan", ["1. Keep it short"], ["Post 1"])):
        engine.prompts.clear()
        judge.judge([inp], mode, 5)
        text = "\n".join(m["content"] for m in engine.prompts[0])
        assert all(p in text for p in present) and not any(a in text for a in absent), mode
        assert "How do I cook rice?" in text and "Result: A" in text


def _sec_text(s1: float, s2: float) -> str:
    return format_sec(SEC("Likes brevity.", [Criterion("Brevity", 1.0)], [CriterionScore("Brevity", 5, 5)],
                          {"response_1": s1, "response_2": s2}))


def test_sec_judge_predicts_by_final_scores_and_reports_ties():
    def script(text):
        return _sec_text(8, 3) if slot_of_chosen(text) == "A" else _sec_text(2.5, "9")  # type: ignore[arg-type]

    engine = FakeEngine(script)
    judge = PairwiseJudge(engine, params=GREEDY, seed=1, fmt="sec")
    inputs = [make_input(f"q{i}") for i in range(20)]
    verdicts = judge.judge(inputs, "none", 5)
    assert all(v.correct and v.sec is not None for v in verdicts)
    assert {v.scores for v in verdicts} == {(8.0, 3.0), (2.5, 9.0)}
    prompt = "\n".join(m["content"] for m in engine.prompts[0])
    assert "User: Best pan?\nChosen: Cast iron.\nRejected: Any." in prompt and "I like short answers." in prompt
    assert "[Response 1]" in prompt and "[Response 2]" in prompt
    no_stated = PairwiseJudge(engine, params=GREEDY, seed=1, fmt="sec", use_stated_preferences=False)
    engine.prompts.clear()
    no_stated.judge(inputs[:1], "none", 5)
    assert "I like short answers." not in "\n".join(m["content"] for m in engine.prompts[0])
    tie_judge = PairwiseJudge(FakeEngine(lambda t: _sec_text(6, 6)), params=GREEDY, seed=1, fmt="sec")
    ties = tie_judge.judge(inputs, "none", 5)
    assert all(v.error == "tie" and v.predicted is None and not v.correct and v.scores == (6.0, 6.0) for v in ties)
    broken = PairwiseJudge(FakeEngine(lambda t: "<final>{oops</final>"), params=GREEDY, seed=1, fmt="sec")
    assert all(v.error == "bad_json" for v in broken.judge(inputs[:3], "none", 5))


def test_pointwise_judge():
    def script(text):
        answer = text.split("[Answer]")[1]
        return "Score: 8" if "CHOSEN" in answer else ("Score: 3" if "REJECTED" in answer else "??")

    judge = PointwiseJudge(FakeEngine(script), params=GREEDY)
    scores = judge.score_pairs([make_input("a"), make_input("b")], "profile", 3)
    assert [(s.chosen, s.rejected, s.error, s.correct) for s in scores] == [(8.0, 3.0, None, True)] * 2
    bad = PointwiseJudge(FakeEngine(lambda t: "Score: 5" if "CHOSEN" in t.split("[Answer]")[1] else "Score: 42"),
                         params=GREEDY).score_pairs([make_input()], "none", 3)[0]
    assert (bad.chosen, bad.rejected, bad.error, bad.correct) == (5.0, None, "bad_score", False)
    tie = PointwiseJudge(FakeEngine(lambda t: "Score: 5"), params=GREEDY).score_pairs([make_input()], "none", 3)[0]
    assert tie.tie and not tie.correct


def test_planner_parses_and_attaches_aspects():
    engine = FakeEngine(lambda t: "1. Short answers\n2. Short answers\n3. Metric units" if "rice" in t else None)
    planner = Planner(engine, params=GREEDY, max_aspects=5)
    results = planner.plan([make_input(), make_input(question="?", context=[])], top_k=2)
    assert results[0].aspects == ["Short answers", "Metric units"] and results[0].error is None
    assert results[1].aspects == [] and results[1].error == "engine_error"
    prompt = "\n".join(m["content"] for m in engine.prompts[0])
    assert "Post 2 (Category: anime):" in prompt and "Post 3" not in prompt
    planned = with_plans([make_input(), make_input()], results)
    assert planned[0].plan == ["Short answers", "Metric units"] and planned[1].plan == []


# ----------------------------------------------------------------------------------------------------------------
# The real tiny model (random weights: garbage text, so failures must be counted, never raised)
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_engine():
    from pr_rlhf.configs.recipe import engine_config
    from pr_rlhf.models import make_engine

    engine = make_engine(engine_config(backend="hf", model="tiny", max_model_len=2048))
    yield engine
    engine.close()


def _tally(errors) -> Counter:
    tally = Counter(errors)
    assert set(tally) <= set(ERROR_KINDS) | {None} and "internal" not in tally
    return tally


def test_tiny_model_judges_and_plans_without_raising(tiny_engine):
    inputs = [make_input(f"q{i}", plan=["Short answers"]) for i in range(3)]
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=0)  # varied garbage, reproducible
    verdicts = PairwiseJudge(tiny_engine, params=params, seed=0).judge(inputs, "profile", 3, both_orders=True)
    assert len(verdicts) == 6 and all(isinstance(v, JudgeVerdict) for v in verdicts)
    tally = _tally(v.error for v in verdicts)
    assert sum(v.correct for v in verdicts) + sum(tally[k] for k in tally if k) <= len(verdicts)
    sec = PairwiseJudge(tiny_engine, params=params, seed=0, fmt="sec").judge(inputs, "plan", 3)
    assert sum(n for k, n in _tally(v.error for v in sec).items() if k) >= 1  # garbage never parses as a chain
    plans = Planner(tiny_engine, params=params).plan(inputs, top_k=3)
    _tally(p.error for p in plans)
    points = PointwiseJudge(tiny_engine, params=params).score_pairs(inputs, "none", 3)
    _tally(p.error for p in points)


# ----------------------------------------------------------------------------------------------------------------
# Scalar RM on the tiny model
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scalar_rm():
    from pr_rlhf.configs.recipe import ScalarRMConfig
    from pr_rlhf.reward.scalar import ScalarRM

    return ScalarRM(ScalarRMConfig(model="tiny", max_length=160, batch_size=3))


def test_scalar_rm_scores_deterministically(scalar_rm):
    inputs = [make_input(f"q{i}", chosen=f"CHOSEN answer {i}", rejected="REJECTED " * (i + 1)) for i in range(5)]
    first = scalar_rm.score_pairs(inputs, "none", 3)
    second = scalar_rm.score_pairs(inputs, "none", 3)
    assert [(s.chosen, s.rejected) for s in first] == [(s.chosen, s.rejected) for s in second]
    assert all(s.error is None and math.isfinite(s.chosen) and math.isfinite(s.rejected) for s in first)
    alone = scalar_rm.score_pairs(inputs[2:3], "none", 3)[0]  # batch composition does not change a score
    assert alone.chosen == pytest.approx(first[2].chosen, abs=1e-4)
    with_profile = scalar_rm.score_pairs(inputs[:1], "profile", 3)[0]
    assert with_profile.chosen != pytest.approx(first[0].chosen, abs=1e-7)
    texts = scalar_rm.score_texts(["How do I cook rice?"] * 2, ["Rinse it.", "Rinse it."])
    assert texts[0] == pytest.approx(texts[1], abs=1e-5) and math.isfinite(texts[0])  # CPU kernels: ~1e-8 by row


def test_scalar_rm_truncates_the_least_relevant_posts_first(scalar_rm):
    long_posts = [{"id": f"p{i}", "text": "a long post about stews " * 30, "category": "cooking"} for i in range(10)]
    inp = make_input(retrieved=long_posts)
    full = scalar_rm.encode_input(inp, inp.chosen, "none", 10)
    cut = scalar_rm.encode_input(inp, inp.chosen, "profile", 10)
    block_tokens = len(scalar_rm.encoder._ids(user_block(inp, "profile", 10)))
    assert len(cut) == scalar_rm.max_length == scalar_rm.cfg.max_length < block_tokens
    decoded = scalar_rm.tokenizer.decode(cut)
    assert "How do I cook rice?" in decoded and "CHOSEN answer" in decoded
    assert "Post 1 (Category" in decoded and "Post 10 (Category" not in decoded  # the block's end went first
    assert cut[-len(full) + 10:] == full[-len(full) + 10:]  # question and answer tokens intact
    score = scalar_rm.score_pairs([inp], "profile", 10)[0]
    assert math.isfinite(score.chosen)
    huge = scalar_rm.score_texts(["word " * 2000], ["answer"])[0]  # a prompt alone too long: cut from the left
    assert math.isfinite(huge)
