"""P-GenRM on real data, without a server: the generation cache, the PR judge's template and parser (and its
agreement with the exact PR on world chains under the world's scripted judge), the real-data examples (stated
preferences in PSI prompts only) and the hard-negative rule, and the recipe checks."""
import json

import pytest

from pr_rlhf.configs.recipe import RetrievalConfig, data_config
from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.models.base import Generation, Sample, SamplingParams
from pr_rlhf.models.generation_cache import CachedEngine
from pr_rlhf.pgenrm.cre_reward import process_reward
from pr_rlhf.pgenrm.pr_judge import (
    ChainGroup,
    CoverageJudge,
    ScriptedCoverageJudge,
    judge_prompt,
    judged_rewards,
    parse_coverage,
    world_gold_criteria,
)
from pr_rlhf.pgenrm.psi_data import psi_examples
from pr_rlhf.pgenrm.real_data import grpo_item, hard_flags, load_real_data, response_distance
from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore, format_sec, parse_sec, sec_prompt
from pr_rlhf.world.generator import build_world
from tests import fixtures_raw as fx

TEACHER = {"backend": "openai", "model": "teacher", "base_url": "http://127.0.0.1:9/v1"}


class Counting:
    """An engine that answers each prompt with its own text reversed, n times, and fails prompts with 'FAIL'."""
    name = "counting"

    def __init__(self):
        self.asked: list = []

    def generate(self, prompts, params):
        self.asked += prompts
        return [Generation(error="boom") if "FAIL" in str(p) else
                Generation(samples=[Sample(str(p)[::-1], [1, 2, 3])] * params.n, prompt_token_ids=[7] * 5)
                for p in prompts]

    def close(self):
        pass


def test_generation_cache_never_asks_twice_and_survives_a_torn_line(tmp_path):
    path = tmp_path / "cache.jsonl"
    inner = Counting()
    engine = CachedEngine(inner, path, {"model": "m"}, chunk=2)
    params = SamplingParams(n=2, temperature=0.7, seed=3)
    prompts = ["a", "b", "a", "FAIL", [{"role": "user", "content": "c"}]]
    first = engine.generate(prompts, params)
    assert [g.samples[0].text if g.ok else None for g in first] == ["a", "b", "a", None, str(prompts[4])[::-1]]
    assert len(inner.asked) == 4 and engine.stats.requests == 4 and engine.stats.failed == 1   # "a" sent once
    assert engine.stats.prompt_tokens == 15 and engine.stats.completion_tokens == 18
    with path.open("a") as f:
        f.write('{"key": "torn')                       # a run killed mid-write
    again = CachedEngine(inner := Counting(), path, {"model": "m"})
    second = again.generate(prompts, params)
    assert inner.asked == ["FAIL"] and again.stats.hits == 4 and again.stats.unreadable_lines == 1
    assert [g.samples for g in second if g.ok] == [g.samples for g in first if g.ok]
    # another seed, another model or other sampling: other keys
    for identity, p in (({"model": "m"}, SamplingParams(n=2, temperature=0.7, seed=4)),
                        ({"model": "other"}, params), ({"model": "m"}, SamplingParams(n=1, temperature=0.7, seed=3))):
        fresh = CachedEngine(inner := Counting(), path, identity)
        fresh.generate(["a"], p)
        assert inner.asked == ["a"]


@pytest.mark.parametrize("text,share", [("Coverage: 7/10", 0.7), ("coverage = 0.4", 0.4), ("Coverage: 85%", 0.85),
                                        ("Coverage: 6", 0.6), ("<think>hm</think>Coverage: **9**/10", 0.9),
                                        ("Coverage: 2/10 ... no, Coverage: 3/10", 0.3)])
def test_coverage_parser_reads_the_usual_forms(text, share):
    assert parse_coverage(text).value == pytest.approx(share)


@pytest.mark.parametrize("text", ["", None, 5, "I think it is good", "Coverage: 12/10", "Coverage: -1",
                                  "<think>never closed", "Coverage: lots"])
def test_coverage_parser_returns_typed_failures(text):
    parsed = parse_coverage(text)
    assert not parsed.ok and parsed.error in {"empty", "no_coverage", "unclosed_think"}


def test_judged_pr_agrees_with_the_exact_pr_on_world_chains_under_the_scripted_judge():
    world = build_world(WorldConfig(users=10, cold_start_users=2, reference_samples=500, rendering="compact"))
    pairs = {p.pair_id: p for p in world.pairs}
    names = world.attribute_names
    examples, _ = psi_examples(world, keep_incorrect=True, style="vote")
    judge = CoverageJudge(ScriptedCoverageJudge())
    items, exact = [], []
    for e in examples[:120]:
        sec = parse_sec(e.target).value
        pair, weights = pairs[e.pair_id], world.user(e.user_id).weights
        x1, x2 = (pair.x_chosen, pair.x_rejected) if e.first_is_chosen else (pair.x_rejected, pair.x_chosen)
        items.append((world_gold_criteria(names, x1, x2, weights), sec, pair.question))
        exact.append(process_reward(sec, names, x1, x2, weights))
    judged = judge.grade(items)
    assert judge.stats.graded == len(items) and not judge.stats.failed
    assert max(abs(a - b) for a, b in zip(judged, exact)) < 1e-4
    assert len({round(x, 3) for x in exact}) > 2            # the chains cover their users differently


def test_judged_rewards_count_failures_and_stay_neutral_within_a_group():
    sec = SEC("p", [Criterion("Brevity", 1.0)], [CriterionScore("Brevity", 8, 3)])
    good = format_sec(sec)

    class Judge:
        name = "j"

        def __init__(self):
            self.answers = iter(["Coverage: 8/10", "no idea", "Coverage: 4/10"])

        def generate(self, prompts, params):
            return [Generation(samples=[Sample(next(self.answers))]) for _ in prompts]

    judge = CoverageJudge(Judge())
    groups = [ChainGroup([good, "garbage", good, good], True, "- be brief", "q?"),
              ChainGroup([good], False, "", "q2?")]                 # no gold criteria: no PR
    rewards = judged_rewards(groups, judge, alpha=0.5, beta=1.0, format_penalty=-0.1)
    first = rewards[0]
    assert [r.parsed for r in first] == [True, False, True, True]
    assert first[0].process == pytest.approx(0.8) and first[3].process == pytest.approx(0.4)
    assert first[2].process == pytest.approx(0.6)                  # the judge failed: the group's mean PR
    assert first[1].reward == -0.1 and first[0].reward == pytest.approx(1.4)
    assert rewards[1][0].process is None and rewards[1][0].reward == 0.0     # slot 1 preferred, chosen is 2
    assert judge.stats.as_dict() == {"graded": 2, "failed": {"no_coverage": 1}, "unavailable": 1}
    prompt = judge_prompt("- be brief", sec, "q?")
    assert "- be brief" in prompt[-1]["content"] and "1. Brevity | weight: 100" in prompt[-1]["content"]


@pytest.fixture()
def prism_shards(tmp_path):
    from data_pipelines.build import build_shards

    raw = fx.prism_users_fixture(tmp_path / "raw")
    data = data_config(source="personal_rewardbench", input=str(tmp_path / "raw"), out=str(tmp_path / "shards"),
                       options={"survey": str(raw["survey"])}, retrieval=RetrievalConfig(embedder="bm25", top_k=2))
    build_shards(data)
    return str(tmp_path / "shards"), raw


def test_real_data_examples_show_stated_preferences_to_psi_only(prism_shards):
    shards, raw = prism_shards
    data = load_real_data(shards, history_size=3, seed=0)
    assert len(data.examples) == 4 * 3 and {e.inp.user_id for e in data.examples} == {f"su{i}" for i in range(4)}
    for e in data.examples:
        assert len(e.history_ids) == 3 and e.inp.pair_id not in e.history_ids
        stated = raw["stated"][e.inp.user_id]
        assert e.inp.stated_preferences == stated and e.gold_criteria == stated
        r1, r2 = (e.inp.chosen, e.inp.rejected) if e.first_is_chosen else (e.inp.rejected, e.inp.chosen)
        assert stated in json.dumps(sec_prompt(e.inp, r1, r2, use_stated=True))      # what PSI's teacher sees
        item = grpo_item(e)
        assert "STATED-" not in json.dumps(item.messages)                           # CRE sees the history only
        assert r1 in item.messages[-1]["content"] and item.first_is_chosen == e.first_is_chosen
        flipped = grpo_item(e, not e.first_is_chosen)
        assert flipped.messages != item.messages and flipped.first_is_chosen != item.first_is_chosen
    assert {e.first_is_chosen for e in data.examples} == {True, False}
    # hard negatives: the label margin (PRISM's ratings), the smallest third of the training pool
    assert data.hard_rule == "label_margin"
    margins = {r["conversation_id"]: r["chosen_score"] - r["rejected_score"] for r in raw["rows"]}
    assert all(data.hard[p] == (m <= data.margin_threshold) for p, m in margins.items())
    assert 0 < sum(e.hard for e in data.examples) < len(data.examples)
    assert set(data.hard) == set(margins)              # evaluation pairs get a flag too


def test_hard_negatives_without_ratings_are_the_most_similar_answers():
    pairs = [{"pair_id": "same", "chosen": "a b c d", "rejected": "a b c e", "meta": "{}"},
             {"pair_id": "far", "chosen": "a b", "rejected": "x y", "meta": "{}"},
             {"pair_id": "mid", "chosen": "a b c", "rejected": "a x y", "meta": "{}"}]
    flags, rule, threshold = hard_flags(pairs, {"same", "far", "mid"}, 1 / 3)
    assert rule == "response_similarity" and flags == {"same": True, "far": False, "mid": False}
    assert response_distance("A b", "a B") == 0.0 and response_distance("a", "b") == 1.0
    rated = pairs + [{"pair_id": "r", "chosen": "x", "rejected": "y",
                      "meta": '{"chosen_score": 5, "rejected_score": 4}'}]
    flags, rule, _ = hard_flags(rated, {"r", "same"}, 0.5)
    assert rule == "label_margin" and flags == {"same": False, "far": False, "mid": False, "r": True}


def test_generation_cache_counts_the_servers_billed_tokens_where_it_reports_them(tmp_path):
    class Billing(Counting):
        """Like a hosted API: no token ids, a usage count per response."""

        def __init__(self):
            super().__init__()
            self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

        def generate(self, prompts, params):
            self.usage["prompt_tokens"] += 100 * len(prompts)
            self.usage["completion_tokens"] += 10 * len(prompts)
            return [Generation(samples=[Sample(str(p))]) for p in prompts]

    engine = CachedEngine(Billing(), tmp_path / "c.jsonl", {"model": "m"}, chunk=2)
    engine.generate(["a", "b", "c"], SamplingParams())
    assert (engine.stats.prompt_tokens, engine.stats.completion_tokens) == (300, 30)


def test_a_real_data_run_without_a_pr_judge_rewards_the_outcome_alone(prism_shards, tmp_path):
    """process_reward 'exact' on real data is a valid recipe when every GRPO stage has alpha 0 (no PR at all): its
    GRPO rewards are the outcome alone, and no judge engine is ever built."""
    from pr_rlhf.configs.recipe import Recipe
    from workers.pgenrm import PGenRMPipeline

    shards, _ = prism_shards
    recipe = Recipe(pgenrm={"shards": shards, "out": str(tmp_path / "run"), "stages": ["psi", "cre"],
                            "psi": {"source": "teacher", "teacher": TEACHER}, "cre": {"alpha": 0.0}})
    pipeline = PGenRMPipeline(recipe)
    items = [grpo_item(e) for e in load_real_data(shards, 3, 0).examples[:3]]

    def chain(prefers_first: bool) -> str:
        s1, s2 = (8, 3) if prefers_first else (3, 8)
        return format_sec(SEC("Likes steps.", [Criterion("Steps", 1.0)], [CriterionScore("Steps", s1, s2)]))
    gens = [Generation(samples=[Sample(chain(True)), Sample(chain(False)), Sample("no chain")]) for _ in items]
    rewards, metrics = pipeline.step_rewards(items, gens, recipe.pgenrm.stage_config("cre"))
    assert rewards.tolist() == [r for i in items for r in (float(i.first_is_chosen), float(not i.first_is_chosen),
                                                           -0.1)]
    assert metrics["reward/parse_rate"] == pytest.approx(2 / 3) and metrics["reward/pr_graded"] == 0
