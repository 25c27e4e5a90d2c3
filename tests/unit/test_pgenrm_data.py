"""PSI teacher data on the synthetic world: oracle evaluation chains, their accuracy, and the SFT examples."""
import numpy as np
import pytest

from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.pgenrm.oracle_chain import oracle_chain, percentages
from pr_rlhf.pgenrm.psi_data import psi_examples
from pr_rlhf.reward.sec import format_sec, parse_sec
from pr_rlhf.world.generator import build_world
from pr_rlhf.world.reference import WorldPrior, reference_accuracies


@pytest.fixture(scope="module")
def world():
    return build_world(WorldConfig(users=60, cold_start_users=5, reference_samples=2000))


def test_percentages_sum_to_100():
    for raw in ([1.0], [0.3, 0.3, 0.3], [5.0, 0.001, 0.001], [0.2, 0.7, 0.1, 0.05]):
        pct = percentages(raw)
        assert sum(pct) == 100 and min(pct) >= 1 and len(pct) == len(raw)


def test_chains_parse_back_and_are_as_accurate_as_the_oracle(world):
    prior = WorldPrior.of(world)
    rng = np.random.default_rng(0)
    correct = []
    for user in world.users:
        if user.cold_start:
            continue
        history = world.history(user.user_id, 3)
        for pair in world.pairs_of(user.user_id):
            if pair.split not in ("val", "test"):
                continue
            first = bool(rng.random() < 0.5)
            chain = oracle_chain(world, prior, pair, history, first)
            parsed = parse_sec(format_sec(chain.sec), strict=True)
            assert parsed.ok, parsed
            sec = parsed.value
            assert len(sec.criteria) == int(np.abs(pair.differing).sum())   # exactly the differing attributes
            assert sum(c.weight for c in sec.criteria) == pytest.approx(1.0)
            assert sec.persona.startswith("Example 1: chose")
            prefers_first = sec.final["response_1"] > sec.final["response_2"]
            correct.append(prefers_first == first)
    oracle = reference_accuracies(world)["oracle"]
    assert abs(np.mean(correct) - oracle.accuracy) < 0.04, (np.mean(correct), oracle)


def test_psi_examples_are_rejection_sampled_and_deterministic(world):
    examples, stats = psi_examples(world, history_size=3, seed=0)
    again, _ = psi_examples(world, history_size=3, seed=0)
    assert [e.target for e in examples] == [e.target for e in again]
    assert stats.examples == 60 * 5 and 0.7 < stats.kept_share < 0.95, stats
    assert len(examples) == stats.kept and all(e.correct for e in examples)
    assert 0.35 < np.mean([e.first_is_chosen for e in examples]) < 0.65
    history_ids = {p.pair_id for u in world.users for p in world.history(u.user_id, 3)}
    assert not history_ids & {e.pair_id for e in examples}
    e = examples[0]
    prompt = e.messages[-1]["content"]
    assert "Example 1" in prompt and "[Response 1]" in prompt and "[Response 2]" in prompt
    parsed = parse_sec(e.target, strict=True).value
    assert (parsed.final["response_1"] > parsed.final["response_2"]) == e.first_is_chosen
    hard_kept, hard_seen = stats.per_hardness["hard"]
    assert 0 < hard_kept <= hard_seen
    everything, all_stats = psi_examples(world, history_size=3, seed=0, keep_incorrect=True)
    assert len(everything) == all_stats.examples and sum(not e.correct for e in everything) > 0


def test_compact_style_is_shorter_and_parses_to_the_same_choice():
    world = build_world(WorldConfig(users=20, cold_start_users=2, reference_samples=1000, rendering="compact"))
    full, full_stats = psi_examples(world, style="full")
    compact, compact_stats = psi_examples(world, style="compact")
    assert full_stats.kept == compact_stats.kept and [e.pair_id for e in full] == [e.pair_id for e in compact]
    for f, c in zip(full, compact):
        pf, pc = parse_sec(f.target, strict=True).value, parse_sec(c.target).value
        # the compact chain has no <final> block: the parser's weighted sums are the full chain's final scores
        assert "<final>" not in c.target and pc.final_source == "recomputed"
        assert pc.final == pytest.approx(pf.final, abs=1e-4)
        assert [x.weight for x in pf.criteria] == [x.weight for x in pc.criteria]
        assert all(x.name[0] in "+-" for x in pc.criteria)
        # the compact persona states a direction for every attribute before the rubric
        stated = pc.persona.split("Prefers:")[1].replace("Weakly:", "")
        assert all(x.name in stated.split() for x in pc.criteria)
        assert len(c.target) < len(f.target)
        size = lambda e: sum(len(m["content"]) for m in e.messages)  # noqa: E731
        assert size(c) < 0.5 * size(f)
        assert c.messages[-1]["content"].startswith("Example 1: ") and c.messages[-1]["content"].count("\n") == 5
    assert sum(len(c.target) for c in compact) < 0.85 * sum(len(f.target) for f in full)


def test_history_variants_add_distinct_histories_of_train_pairs_only():
    world = build_world(WorldConfig(users=10, cold_start_users=2, reference_samples=1000, rendering="compact"))
    one, _ = psi_examples(world, style="compact", keep_incorrect=True)
    three, stats = psi_examples(world, style="compact", keep_incorrect=True, history_variants=3)
    assert all(e in three for e in one)                # variant 0 is the plain data set
    per_user = world.config.history_size
    assert stats.examples == len(one) + 2 * per_user * world.config.users
    train_ids = {p.pair_id for p in world.pairs if p.split == "train"}
    assert {e.pair_id for e in three} <= train_ids
    prompts = {e.messages[-1]["content"] for e in three}
    assert len(prompts) > 0.95 * len(three)            # (history, pair, slot order) rarely repeats
    sizes = {e.messages[-1]["content"].count("Example ") for e in three}
    assert sizes == {1, 2, 3}                          # variant v has min(v, 3) history pairs


def test_cre_reward_outcome_process_and_format_penalty(world):
    from pr_rlhf.pgenrm.cre_reward import cre_reward, criterion_attribute

    assert criterion_attribute("+detail") == ("detail", True)
    assert criterion_attribute("Keeps a calm, measured tone without exclamation marks") == ("enthusiasm", False)
    assert criterion_attribute("Be nice") is None
    prior = WorldPrior.of(world)
    names = world.attribute_names
    user = world.users[0]
    history = world.history(user.user_id, 3)
    pair = next(p for p in world.pairs_of(user.user_id, "test") if np.abs(p.differing).sum() >= 2)
    for style in ("full", "compact"):
        for first in (True, False):
            chain = oracle_chain(world, prior, pair, history, first, style)
            x1, x2 = (pair.x_chosen, pair.x_rejected) if first else (pair.x_rejected, pair.x_chosen)
            r = cre_reward(format_sec(chain.sec), first, names, x1, x2, user.weights)
            assert r.parsed and r.outcome == float(chain.correct)
            # the oracle's signs are the posterior's: where they match the true weights, the criterion counts
            diff = [j for j in range(len(names)) if x1[j] != x2[j]]
            agree = [j for j in diff if (chain.posterior_mean[j] > 0) == (user.weights[j] > 0)]
            want = sum(abs(user.weights[j]) for j in agree) / sum(abs(user.weights[j]) for j in diff)
            assert r.process == pytest.approx(want)
            assert r.reward == pytest.approx(0.5 * r.process + r.outcome)
    truth_chain = oracle_chain(world, prior, pair, history, True, "compact")
    for c, s in zip(truth_chain.sec.criteria, truth_chain.sec.scores):   # rewrite with the true directions
        j = names.index(c.name[1:])
        c.name = s.name = ("+" if user.weights[j] > 0 else "-") + names[j]
    assert cre_reward(format_sec(truth_chain.sec), True, names, pair.x_chosen, pair.x_rejected,
                      user.weights).process == pytest.approx(1.0)
    bad = cre_reward("no chain at all", True, names, pair.x_chosen, pair.x_rejected, user.weights)
    assert (bad.reward, bad.parsed, bad.outcome) == (-0.1, False, None)
    assert cre_reward("<final>{oops", True, names, pair.x_chosen, pair.x_rejected, user.weights).reward == -0.1


def test_planner_examples_round_trip_and_aspect_metrics(tmp_path):
    from data_pipelines.build import build_shards
    from pr_rlhf.configs.recipe import data_config
    from pr_rlhf.pgenrm.planner_data import aspect_precision_recall, planner_examples, world_aspect_key
    from pr_rlhf.reward.planner import parse_aspects

    out = tmp_path / "shards"
    build_shards(data_config(source="synthetic", out=str(out), retrieval={"embedder": "bm25"}),
                 WorldConfig(users=6, cold_start_users=2, reference_samples=200))
    train = planner_examples(str(out), splits=("train",))
    test = planner_examples(str(out), splits=("test",))
    assert train and test and not {e.query_id for e in train} & {e.query_id for e in test}
    e = train[0]
    assert "Post 1 (Category:" in e.messages[-1]["content"] and e.messages[-1]["content"].rstrip().endswith(
        "Aspects this user expects from an answer:")
    assert parse_aspects(e.target).value == e.aspects and len(e.aspects) == 3
    gold = e.aspects
    assert aspect_precision_recall(gold, gold, world_aspect_key) == (1.0, 1.0)
    assert aspect_precision_recall(gold[:1] + ["Be kind"], gold, world_aspect_key) == (0.5, 1 / 3)
    flipped = [f"{'-' if wants else '+'}{name}" for name, wants in map(world_aspect_key, gold)]
    assert aspect_precision_recall(flipped, gold, world_aspect_key) == (0.0, 0.0)   # right topic, wrong direction
    assert aspect_precision_recall([g.upper() + "." for g in gold], gold) == (1.0, 1.0)   # text match normalizes
    assert aspect_precision_recall([], gold) == (0.0, 0.0)


def test_teacher_chains_are_rejection_sampled_and_failures_counted():
    from pr_rlhf.models.base import Generation, Sample, SamplingParams
    from pr_rlhf.pgenrm.teacher import teacher_examples
    from pr_rlhf.reward.inputs import RMInput
    from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore

    def chain(prefers_first: bool) -> str:
        s1, s2 = (8.0, 3.0) if prefers_first else (3.0, 8.0)
        return format_sec(SEC("Likes short answers.", [Criterion("Brevity", 1.0)], [CriterionScore("Brevity", s1, s2)]))

    class Teacher:
        """Sees where the chosen answer sits; per pair id: right, wrong, garbage, tie, engine error."""
        name = "teacher"

        def generate(self, prompts, params):
            out = []
            for prompt in prompts:
                text = prompt[-1]["content"]
                first = text.index("GOOD") < text.index("BAD")
                kind = text.split("Q-")[1][:5]
                if kind == "error":
                    out.append(Generation(error="timeout"))
                    continue
                replies = {"right": [chain(first)] * params.n, "wrong": [chain(not first)] * params.n,
                           "junky": ["no chain"] + [chain(first)] * (params.n - 1),
                           "tiesx": ["<persona>x</persona><final>{\"response_1\": 5, \"response_2\": 5}</final>"]
                           * params.n}[kind]
                out.append(Generation(samples=[Sample(text=t) for t in replies]))
            return out

    inputs = [RMInput(pair_id=f"p{i}-{k}", user_id="u", subset="s", question=f"Q-{k}?", chosen="GOOD answer",
                      rejected="BAD answer", history=[{"question": "q", "chosen": "c", "rejected": "r"}])
              for i in range(4) for k in ("right", "wrong", "junky", "tiesx", "error")]
    examples, stats = teacher_examples(inputs, Teacher(), SamplingParams(temperature=0.7), seed=0, samples_per_pair=2)
    assert stats.pairs == 20 and stats.chains == 40
    assert stats.kept == 8 and {e.pair_id.split("-")[1] for e in examples} == {"right", "junky"}
    assert stats.rejected == {"wrong": 8, "no_json": 4, "tie": 8, "engine_error": 8, "duplicate": 4}
    assert {e.first_is_chosen for e in examples} == {True, False}          # seeded slots, both used
    for e in examples:
        parsed = parse_sec(e.target, strict=True).value
        assert (parsed.final["response_1"] > parsed.final["response_2"]) == e.first_is_chosen


def test_trace_style_transliterates_aligned_columns_and_decides_by_the_posterior_mean():
    world = build_world(WorldConfig(users=12, cold_start_users=2, reference_samples=1000, rendering="compact"))
    prior = WorldPrior.of(world)
    compact, _ = psi_examples(world, style="compact", keep_incorrect=True, prior=prior)
    trace, _ = psi_examples(world, style="trace", keep_incorrect=True, prior=prior)
    names = world.attribute_names
    pairs = {p.pair_id: p for p in world.pairs}
    decisive = 0
    for c, t in zip(compact, trace):
        assert c.messages == t.messages                                   # same prompt
        pt = parse_sec(t.target).value
        assert [x.name[1:] for x in pt.criteria] == list(names)           # the whole rubric, catalog order
        lines = pt.persona.splitlines()
        assert [line.split(":")[0] for line in lines[-4:]] == ["Prefers", "Response 1", "Response 2", "Fit"]
        for line in lines[:-1]:                                           # every line: every attribute, in order
            assert [tok[1:] for tok in line.split(": ")[1].replace("> ", "").split()][:len(names)] == list(names)
        pair = pairs[t.pair_id]
        x1, x2 = (pair.x_chosen, pair.x_rejected) if t.first_is_chosen else (pair.x_rejected, pair.x_chosen)
        assert lines[-3] == "Response 1: " + " ".join(f"{'+' if v else '-'}{n}" for n, v in zip(names, x1))
        prefers = [tok[0] == "+" for tok in lines[-4].split(": ")[1].split()]
        fit = [tok[len(n):] for n, tok in zip(names, lines[-1].split(": ")[1].split())]
        for j, (f, s) in enumerate(zip(fit, pt.scores)):
            assert f == ("=" if x1[j] == x2[j] else "1" if bool(x1[j]) == prefers[j] else "2")
            assert (s.response_1, s.response_2) == {"=": (5, 5), "1": (9, 1), "2": (1, 9)}[f]
        # the decision is the posterior-mean utility difference's sign (up to the percentages' rounding)
        hist = np.array([p.differing for p in world.history(pair.user_id, 3)])   # variant 0: the first 3 pairs
        margin = float(prior.posterior_weights(hist) @ prior.samples @ (np.array(x1) - np.array(x2)))
        if abs(margin) > 0.05:
            decisive += 1
            assert (pt.final["response_1"] > pt.final["response_2"]) == (margin > 0)
    assert decisive > 50


def test_vote_style_votes_for_the_user_type_and_decides_by_its_weights():
    world = build_world(WorldConfig(users=12, cold_start_users=2, reference_samples=1000, rendering="compact"))
    prior = WorldPrior.of(world)
    trace, _ = psi_examples(world, style="trace", keep_incorrect=True, prior=prior)
    vote, _ = psi_examples(world, style="vote", keep_incorrect=True, prior=prior)
    labels = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:len(world.archetypes)]
    pairs = {p.pair_id: p for p in world.pairs}
    decisive = 0
    for t, v in zip(trace, vote):
        assert t.messages == v.messages                                   # same prompt as the trace style
        pv = parse_sec(v.target).value
        lines = pv.persona.splitlines()
        history = [line for line in lines if line.startswith("Example ")]
        agrees = [line.split(": ")[1] for line in lines if line.startswith("Agrees ")]
        assert len(history) == len(agrees) and history == [x for x in t.target.splitlines() if x.startswith("Example ")]
        votes = dict.fromkeys(labels, 0)
        for line, agreed in zip(history, agrees):
            chosen, rejected = (np.array([tok[0] == "+" for tok in side.split()], dtype=float)
                                for side in line.split(": ")[1].split(" > "))
            expect = [k for k, a in zip(labels, world.archetypes) if a @ (chosen - rejected) > 0]
            assert agreed == (" ".join(expect) or "none")
            for k in expect:
                votes[k] += 1
        expected_votes = "Votes: " + " ".join(f"{k}{n}" for k, n in votes.items())
        assert next(x for x in lines if x.startswith("Votes: ")) == expected_votes
        voted = max(labels, key=lambda k: (votes[k], -labels.index(k)))   # most votes, the first on ties
        assert next(x for x in lines if x.startswith("Type: ")) == f"Type: {voted}"
        weights = world.archetypes[labels.index(voted)]
        signed = [f"{'+' if w > 0 else '-'}{n}" for w, n in zip(weights, world.attribute_names)]
        assert [c.name for c in pv.criteria] == signed
        pair = pairs[v.pair_id]
        x1, x2 = (pair.x_chosen, pair.x_rejected) if v.first_is_chosen else (pair.x_rejected, pair.x_chosen)
        margin = float(weights @ (np.array(x1) - np.array(x2)))
        if abs(margin) > 0.05:                                            # the voted type's utility difference
            decisive += 1
            assert (pv.final["response_1"] > pv.final["response_2"]) == (margin > 0)
    assert decisive > 50
