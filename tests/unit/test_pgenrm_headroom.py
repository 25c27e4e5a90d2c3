"""The headroom check before RL, the beatable teacher, contested pairs, and the GRPO step's group bookkeeping."""
from collections import Counter

import numpy as np
import pytest

from pr_rlhf.configs.pgenrm import GRPOStageConfig, pgenrm_config
from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.pgenrm.headroom import (
    HeldOutItem,
    candidate_roles,
    decision_position,
    gate,
    held_out_items,
    offline_headroom,
    pipeline_headroom,
    sample_statistics,
    teacher_expected,
    type_choice,
    type_choice_table,
    type_correct,
)
from pr_rlhf.pgenrm.oracle_chain import TYPE_LABELS, oracle_chain, teacher_types, vote_type
from pr_rlhf.pgenrm.psi_data import grpo_pool, in_other_order, is_contested, psi_examples, teacher_chain
from pr_rlhf.world.generator import build_world
from pr_rlhf.world.reference import WorldPrior

WORLD = WorldConfig(rendering="compact", n_attributes=3, n_archetypes=3, max_differing_attributes=2, users=60,
                    cold_start_users=10, reference_samples=2000)


@pytest.fixture(scope="module")
def world():
    return build_world(WORLD)


@pytest.fixture(scope="module")
def prior(world):
    return WorldPrior.of(world)


def test_teacher_types_follow_the_most_recent_history_pair(world):
    user = next(u for u in world.users if not u.cold_start)
    history = world.history(user.user_id, 3)
    agrees, _, voted = vote_type(world.archetypes, history)
    assert teacher_types(world.archetypes, history, "votes") == [voted]
    assert teacher_types(world.archetypes, history, "recent_pair") == (agrees[-1] or [0, 1, 2])
    assert teacher_types(world.archetypes, [], "recent_pair") == [0, 1, 2]   # no evidence: any type


def test_a_pair_is_contested_exactly_when_the_candidate_types_decide_differently(world, prior):
    seen = contested = 0
    for item in held_out_items(world, "seen", 3):
        decisions = {type_correct(world, prior, item, k)
                     for k in teacher_types(world.archetypes, item.history, "recent_pair")}
        assert is_contested(world, prior, item.pair, item.history) == (len(decisions) > 1)
        seen += 1
        contested += len(decisions) > 1
    assert 0.1 < contested / seen < 0.5, contested / seen


def test_offline_headroom_votes_teacher_is_the_rule_and_the_beatable_one_is_below_it(world, prior):
    h = offline_headroom(world, "recent_pair", 3, prior=prior)
    seen = h["groups"]["seen"]
    assert seen["pairs"] == len(held_out_items(world, "seen", 3))
    assert seen["teachers"]["votes"] == seen["best_rule"]                      # the vote teacher *is* the rule
    assert h["designs"]["votes"]["go"] is False and h["designs"]["votes"]["rule_minus_teacher"] == 0.0
    rp = seen["teachers"]["recent_pair"]
    assert rp["all"] < seen["best_rule"]["all"] - 0.03                         # the rule beats this teacher ...
    assert rp["contested"] < seen["best_rule"]["contested"]                    # ... most on contested pairs
    assert rp["rest"] == pytest.approx(seen["best_rule"]["rest"], abs=0.1)
    assert h["gate"] == h["designs"]["recent_pair"]
    assert seen["bayes"]["all"] >= seen["best_rule"]["all"] - 0.03


def test_stated_teacher_decides_by_the_true_type_unless_stale(world, prior):
    item = held_out_items(world, "seen", 3)[0]
    true = world.user(item.pair.user_id).archetype
    assert teacher_expected(world, prior, item, "stated", stale=0.0) == float(type_correct(world, prior, item, true))
    others = [float(type_correct(world, prior, item, k)) for k in range(3) if k != true]
    assert teacher_expected(world, prior, item, "stated", stale=1.0) == pytest.approx(np.mean(others))


def test_gate_needs_every_condition_and_says_which_failed():
    rule = {"all": 0.88, "contested": 0.78, "rest": 0.92}
    assert gate(rule, {"all": 0.78, "contested": 0.50, "rest": 0.9}, 0.26)["go"]
    no = gate(rule, {"all": 0.85, "contested": 0.70, "rest": 0.9}, 0.10)
    assert not no["go"] and len(no["failed"]) == 3 and no["verdict"].startswith("no go")


def test_decision_position_is_the_first_token_after_type():
    pieces = ["Votes", ":", " A2", " B0", "\n", "Type", ":", " ", "B", "\n", "Prefers"]
    assert decision_position(pieces) == 8
    assert decision_position(["Type: C", "\n"]) == 0      # marker and decision in one token
    assert decision_position(["Votes: A1"]) is None


def test_sample_statistics_greedy_majority_pass_and_mixed():
    decisions = [[1, 1, 0, None], [0, 0, 0, 0], [1, 0, None, None], [None] * 4]
    stats = sample_statistics(decisions, [1, 0, 0, None])
    assert stats["greedy"] == 0.25
    assert stats["maj"] == pytest.approx(1.5 / 4)   # a tie of votes counts half, no valid sample is wrong
    assert stats["pass"] == 0.5
    assert stats["mixed_share"] == 0.5
    assert stats["invalid_sample_share"] == pytest.approx(7 / 16)


def test_recent_pair_teacher_writes_the_same_lines_but_draws_the_type(world, prior):
    votes, vstats = psi_examples(world, 3, seed=0, keep_incorrect=True, prior=prior, style="vote")
    beat, bstats = psi_examples(world, 3, seed=0, keep_incorrect=True, prior=prior, style="vote",
                                teacher="recent_pair")
    assert len(votes) == len(beat) == vstats.examples == bstats.examples       # no label filter: every chain
    assert bstats.kept_share < vstats.kept_share - 0.03                         # the beatable teacher errs more
    assert [e.first_is_chosen for e in votes] == [e.first_is_chosen for e in beat]
    differs = 0
    for v, b in zip(votes, beat):
        assert v.messages == b.messages and v.contested == b.contested
        head_v, head_b = v.target.split("Type:")[0], b.target.split("Type:")[0]
        assert head_v == head_b                                                  # evidence and votes unchanged
        differs += v.target != b.target
    assert differs > 0
    filtered, fstats = psi_examples(world, 3, seed=0, prior=prior, style="vote", teacher="recent_pair")
    assert all(e.correct for e in filtered) and len(filtered) == fstats.kept


def within_binomial(count: int, draws: int, p: float) -> bool:
    """``count`` of ``draws`` is within 4 standard deviations of Binomial(draws, p) (a false alarm ~6e-5)."""
    return abs(count - draws * p) <= 4 * np.sqrt(draws * p * (1 - p))


def test_recent_pair_type_is_drawn_uniformly_among_the_candidates(world, prior):
    """The teacher's ``Type`` is always one of the candidates (the types agreeing with the latest history pair)
    and drawn uniformly among them, deterministically per seeded stream: a teacher that always took the first
    (or any fixed) candidate fails the frequency checks."""
    examples, _ = psi_examples(world, 3, seed=0, keep_incorrect=True, prior=prior, style="vote",
                               teacher="recent_pair")
    pairs = {p.pair_id: p for p in world.pairs}

    def typed(text: str) -> str:
        return text.split("Type:")[1].split()[0]

    firsts = multi = 0
    for e in examples:
        candidates = [TYPE_LABELS[k] for k in teacher_types(world.archetypes, [pairs[h] for h in e.history_ids],
                                                             "recent_pair")]
        assert typed(e.target) in candidates
        if len(candidates) == 2:
            multi += 1
            firsts += typed(e.target) == candidates[0]
    assert multi > 100 and within_binomial(firsts, multi, 0.5), (firsts, multi)   # one stream per example

    # many seeded draws for one pair: two candidates (its history), then all three types (no history)
    two = next(e for e in examples if len(teacher_types(
        world.archetypes, [pairs[h] for h in e.history_ids], "recent_pair")) == 2)
    pair, history = pairs[two.pair_id], [pairs[h] for h in two.history_ids]

    def draw(shown: list, s: int) -> str:
        return typed(teacher_chain(world, prior, pair, shown, True, "vote", "recent_pair",
                                   np.random.default_rng([s, 7])).sec.persona)
    for shown, draws in ((history, 600), ([], 240)):
        candidates = teacher_types(world.archetypes, shown, "recent_pair")
        assert len(candidates) == (2 if shown else 3)
        picked = [draw(shown, s) for s in range(draws)]
        counts = Counter(picked)
        assert set(counts) == {TYPE_LABELS[k] for k in candidates}, counts           # every candidate is drawn
        assert all(within_binomial(c, draws, 1 / len(candidates)) for c in counts.values()), counts
        assert [draw(shown, s) for s in range(0, draws, 37)] == picked[::37]         # the same seed, the same draw


def test_other_order_swaps_the_slots_of_the_same_prompt(world, prior):
    examples, _ = psi_examples(world, 3, seed=0, keep_incorrect=True, prior=prior, style="vote")
    e = examples[0]
    flipped = in_other_order(e, world)
    assert flipped.first_is_chosen != e.first_is_chosen and flipped.pair_id == e.pair_id
    def responses(example):
        lines = example.messages[-1]["content"].splitlines()
        return [next(x for x in lines if x.startswith(f"Response {i}:")).split(":", 1)[1] for i in (1, 2)]
    assert responses(flipped) == responses(e)[::-1] and responses(e)[0] != responses(e)[1]
    assert in_other_order(flipped, world).messages == e.messages


def test_grpo_pool_keeps_the_evaluation_shaped_prompts(world, prior):
    examples, _ = psi_examples(world, 3, seed=0, keep_incorrect=True, prior=prior, style="vote", history_variants=4)
    sizes = {len(e.history_ids) for e in examples}
    assert sizes == {1, 2, 3}
    pool = grpo_pool(examples, 3)
    assert pool and all(len(e.history_ids) == 3 for e in pool)
    assert len(pool) == sum(len(e.history_ids) == 3 for e in examples) and grpo_pool(examples) == examples
    with pytest.raises(ValueError, match="history pairs"):
        grpo_pool(examples, 4)
    cfg = pgenrm_config(world=WORLD, psi={"teacher": "recent_pair", "history_variants": 4},
                       cre={"min_history": 3, "hard_kind": "contested", "hard_share_start": 0.9,
                            "hard_share_end": 0.9})
    offline = pipeline_headroom(cfg, 0, world, prior, examples)
    stats = offline["grpo_pool"]
    assert stats["prompts"] == len(pool) and stats["stage_contested_share"] == 0.9
    # contested prompts are where a teacher-like policy's groups disagree: the stage's mix has more of them
    assert stats["contested_share"] < 0.9
    assert stats["expected_groups_with_variance_at_stage_mix"] > stats["expected_groups_with_variance"]


def test_chain_decision_of_a_type_matches_the_oracle_chain(world, prior):
    item = held_out_items(world, "seen", 3)[3]
    for k in range(3):
        chain = oracle_chain(world, prior, item.pair, item.history, False, "vote", type_index=k)
        assert chain.correct == type_correct(world, prior, HeldOutItem(item.pair, item.history), k)
        assert f"Type: {TYPE_LABELS[k]}" in chain.sec.persona


def test_grpo_stage_options_validate():
    with pytest.raises(ValueError, match="odd"):
        GRPOStageConfig(group_size=3, both_orders=True)
    cfg = pgenrm_config()
    control = cfg.stage_config("control")
    assert control.hard_share_start is None and control.steps == cfg.curriculum.steps
    assert control.alpha == cfg.curriculum.alpha


def test_type_choice_reads_the_chain_against_its_own_votes():
    lines = "Example 1: x > y\nAgrees 1: A\nExample 2: x > y\nAgrees 2: A C\nVotes: A2 B0 C1\nType: {}\nPrefers: +a"
    assert type_choice(lines.format("A")) == "top"
    assert type_choice(lines.format("C")) == "non_top"
    assert type_choice(lines.format("B")) is None                     # not among the latest pair's candidates
    tied = "Agrees 1: B C\nVotes: A0 B1 C1\nType: {}\n"
    assert type_choice(tied.format("B")) == "tie_first" and type_choice(tied.format("C")) == "tie_other"
    assert type_choice("Votes: A1\n") is None and type_choice("garbage <persona>") is None
    rows = [{"pair_id": "p1", "raw": tied.format("B"), "correct": True},
            {"pair_id": "p2", "raw": tied.format("C"), "correct": False},
            {"pair_id": "p3", "raw": "unparseable", "correct": False},
            {"pair_id": "p4", "raw": tied.format("C"), "correct": True}]
    table = type_choice_table(rows, only={"p1", "p2", "p3"})
    assert table == {"tie_first": {"pairs": 1, "accuracy": 1.0}, "tie_other": {"pairs": 1, "accuracy": 0.0},
                     "unread": {"pairs": 1, "accuracy": 0.0}}


def test_candidate_roles_agree_with_the_type_choice_read_from_each_candidates_chain(world, prior):
    items = held_out_items(world, "seen", 3)
    roles = candidate_roles(world, prior, items)
    expected: dict[str, list[float]] = {}
    for it in items:
        if not is_contested(world, prior, it.pair, it.history):
            continue
        for k in teacher_types(world.archetypes, it.history, "recent_pair"):
            chain = oracle_chain(world, prior, it.pair, it.history, True, "vote", type_index=k)
            expected.setdefault(type_choice(chain.sec.persona), []).append(float(chain.correct))
    assert roles and set(roles) == set(expected) <= {"top", "non_top", "tie_first", "tie_other"}
    for role, values in expected.items():
        assert roles[role]["candidates"] == len(values)
        assert roles[role]["right"] == pytest.approx(np.mean(values))
    assert roles["top"]["right"] > roles["non_top"]["right"]    # the most-voted candidate is the better bet
