"""Test-time user-based scaling: parsing and averaging of m chains (failures counted, never raised), the fusion
with neighbours, the (m, n) decisions read from one pass of evidence, and the judge's requests (one n=m request per
input; neighbours' histories in their prompts; the user never its own neighbour)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pr_rlhf.configs.scaling import ScalingConfig, ScalingEvalConfig
from pr_rlhf.models.base import Generation, Sample, SamplingParams
from pr_rlhf.reward.inputs import RMInput
from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore, format_sec
from pr_rlhf.scaling.fusion import chain_scores, fuse, verdict
from pr_rlhf.scaling.scorer import Evidence, ScaledJudge, decide


def chain(s1: float, s2: float, persona: str = "Type: A") -> str:
    return format_sec(SEC(persona=persona, criteria=[Criterion("fit", 1.0)],
                          scores=[CriterionScore("fit", s1, s2)], final={"response_1": s1, "response_2": s2}))


def gen(*texts: str) -> Generation:
    return Generation(samples=[Sample(text=t) for t in texts])


def test_chain_scores_average_valid_parses_and_count_failures():
    scored = chain_scores(gen(chain(9, 1), "no chain at all", chain(5, 7), "<persona>x</persona>"))
    assert scored.valid == 2 and sum(scored.failures.values()) == 2
    assert scored.mean() == (7.0, 4.0)            # over the two valid chains
    assert scored.mean(2) == (9.0, 1.0)           # the first two samples hold one valid chain
    assert scored.mean(1) == (9.0, 1.0) and chain_scores(gen("garbage")).mean() is None
    assert chain_scores(Generation(error="timeout")).failures == Counter({"engine_error": 1})
    assert chain_scores(Generation()).failures == Counter({"empty": 1})


def test_fuse_weights_and_missing_sides():
    assert fuse((8.0, 2.0), (2.0, 6.0)) == (5.0, 4.0)
    assert fuse((8.0, 2.0), (2.0, 6.0), 0.25, 0.75) == (3.5, 5.0)
    assert fuse(None, (2.0, 6.0)) == (2.0, 6.0) and fuse((1.0, 2.0), None) == (1.0, 2.0)
    assert fuse(None, None) is None
    assert verdict((3.0, 1.0)) == "A" and verdict((1.0, 3.0)) == "B" and verdict((2.0, 2.0)) is None


def evidence(asked=(4, 3)) -> Evidence:
    ev = Evidence("p1", "u1", "A", chain_scores(gen(chain(2, 8))), asked=asked)
    ev.samples = chain_scores(gen(chain(9, 1), "bad", chain(2, 8), chain(2, 8)))
    ev.neighbours = [("u2", 0.9), ("u3", 0.8), ("u4", 0.7)]
    ev.neighbour_scores = [(9.0, 1.0), None, (1.0, 9.0)]
    return ev


def test_decide_reads_every_grid_point_from_one_pass():
    ev = evidence()
    assert decide(ev, 0, 0).predicted == "B"                     # the greedy chain
    assert decide(ev, 1, 0).predicted == "A"                     # the first sample
    assert decide(ev, 2, 0).scores == (9.0, 1.0)                 # the second sample did not parse
    assert decide(ev, 4, 0).predicted == "B"                     # (9+2+2)/3 vs (1+8+8)/3
    assert decide(ev, 0, 1).predicted == "A"                     # the best neighbour alone (self weight unused)
    assert decide(ev, 0, 2).scores == (9.0, 1.0)                 # the second neighbour's chain did not parse
    assert decide(ev, 0, 3).failure == "tie"                     # (9+1)/2 both
    fused = decide(ev, 1, 3)                                     # 0.5 * (9, 1) + 0.5 * (5, 5)
    assert fused.scores == (7.0, 3.0) and fused.correct("A")
    with pytest.raises(ValueError, match="gathered"):
        decide(ev, 8, 0)
    empty = Evidence("p2", "u1", "A", chain_scores(gen("x")), asked=(0, 0))
    assert decide(empty, 0, 0).failure == "no_valid_chain" and not decide(empty, 0, 0).correct("A")


class FakeEngine:
    """Prefers response 1 when the prompt's history mentions 'likes-one', else response 2; records its calls."""

    name = "fake"

    def __init__(self):
        self.calls: list[tuple[int, SamplingParams]] = []

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params))
        out = []
        for p in prompts:
            text = " ".join(m["content"] for m in p)
            s1, s2 = (9, 1) if "likes-one" in text else (1, 9)
            persona = "likes one" if "likes-one" in text else "likes two"
            out.append(gen(*[chain(s1, s2, persona)] * params.n))
        return out


class FakeIndex:
    def __init__(self):
        self.asked: list[tuple[int, str | None]] = []

    def neighbours(self, vec, n, exclude=None):
        self.asked.append((n, exclude))
        return [(u, 1.0) for u in ("u1", "u2", "u3") if u != exclude][:n]


class FakeEmbedder:
    name = "fake-embedder"

    def encode(self, texts):
        return np.array([[1.0, float(len(t))] for t in texts])


def triple(tag: str) -> dict:
    return {"question": f"q {tag}", "chosen": f"c {tag}", "rejected": f"r {tag}"}


def test_judge_one_request_per_input_neighbours_with_their_histories():
    engine, index = FakeEngine(), FakeIndex()
    inputs = [RMInput(pair_id=f"p{i}", user_id="u1", subset="s", question="q", chosen="good", rejected="bad",
                      history=[triple("plain")]) for i in range(3)]
    histories = {"u2": [triple("likes-one")], "u3": [triple("likes-one")], "u1": [triple("own")]}
    judge = ScaledJudge(engine, ScalingConfig(m=5, n=2), seed=0, index=index, embedder=FakeEmbedder(),
                        histories=histories)
    out = judge.evidence(inputs)
    sampled = [params for count, params in engine.calls if params.n == 5]
    assert len(sampled) == 1 and not sampled[0].greedy               # all m chains of all inputs: one request
    assert sum(p.greedy for _, p in engine.calls) == 1               # the neighbours' chains; no greedy own chain
    with pytest.raises(ValueError, match="greedy"):
        decide(out[0], 0, 0)                                         # (0, 0) needs the greedy chain
    assert [ex for _, ex in index.asked] == ["u1"] * 3               # the user is never its own neighbour
    assert all([u for u, _ in ev.neighbours] == ["u2", "u3"] for ev in out)
    for ev in out:   # own history says nothing -> response 2; the neighbours' histories -> response 1
        assert ev.samples.mean() == (1.0, 9.0) and ev.neighbour_scores == [(9.0, 1.0), (9.0, 1.0)]
        assert decide(ev, 5, 2).scores == (5.0, 5.0) and decide(ev, 0, 2).scores == (9.0, 1.0)
    assert decide(judge.evidence(inputs[:1], greedy=True)[0], 0, 0).predicted == "B"
    with pytest.raises(ValueError, match="prototypes"):
        ScaledJudge(engine, ScalingConfig(n=2)).evidence(inputs)


def test_scaling_eval_config_validation():
    cfg = ScalingEvalConfig()
    assert cfg.largest == (16, 16) and (0, 0) in cfg.points
    with pytest.raises(ValueError, match="points"):
        ScalingEvalConfig(points=[])
    with pytest.raises(ValueError, match="weight"):
        ScalingConfig(m=1, n=1, self_weight=0, neighbour_weight=0)


def test_reward_worker_scorer_scales_the_genrm_reward():
    """A reward worker's GenRM scorer with a scaling config: the response's reward is its mean response_1 score
    over the m chains (one n=m request), and with neighbours the fused score; failures become errors, not 0."""
    from pr_rlhf.configs.reward import reward_config
    from pr_rlhf.scorers import GenRMScorer, RewardRequest

    class Scripted(FakeEngine):
        def generate(self, prompts, params):
            self.calls.append((len(prompts), params))
            if params.greedy:
                return [gen(chain(2, 8)) for _ in prompts]
            return [gen(chain(9, 1), "broken", chain(6, 4)) for _ in prompts]

    engine = Scripted()
    cfg = reward_config(kind="genrm", sec_format="sec_compact", scaling=ScalingConfig(m=3))
    scorer = GenRMScorer(cfg, engine=engine)
    reqs = [RewardRequest(f"r{i}", "u1", "q", "an answer", meta={"reference": "a reference",
                                                                   "history": [triple("plain")]}) for i in range(2)]
    assert scorer.score(reqs) == [(7.5, None), (7.5, None)]          # (9 + 6) / 2: the broken chain left out
    assert [p.n for _, p in engine.calls if not p.greedy] == [3]
    missing = RewardRequest("r9", "u1", "q", "an answer", meta={})
    assert scorer.score([missing])[0][1].startswith("missing_reference")

    # neighbours: the prototypes' judge (a fake index here) fuses 0.5 / 0.5 with the neighbours' chains
    scaled = cfg.model_copy(update={"scaling": ScalingConfig(m=2, n=2)})   # artifacts injected below
    scorer = GenRMScorer(scaled, engine=FakeEngine())
    scorer._scaler = ScaledJudge(scorer.engine, scorer.cfg.scaling, index=FakeIndex(), embedder=FakeEmbedder(),
                                 histories={"u2": [triple("likes-one")], "u3": [triple("likes-one")]})
    assert scorer.score(reqs[:1]) == [(5.0, None)]                   # own 1 (history says nothing), neighbours 9
    with pytest.raises(ValueError, match="prototypes.path"):
        reward_config(kind="genrm", scaling=ScalingConfig(m=2, n=2))
    with pytest.raises(ValueError, match="sec_reference"):
        reward_config(kind="genrm", genrm_mode="pointwise", scaling=ScalingConfig(m=2))


def test_certainty_weighting_lets_neighbours_speak_where_own_chains_disagree():
    from pr_rlhf.scaling.scorer import agreement

    ev = evidence()                                  # own samples: A, (bad), B, B -> share of A 1/3, c = 1/3
    assert agreement(ev.samples, 4) == pytest.approx(1 / 3) and agreement(ev.samples, 1) == 1.0
    plain = decide(ev, 4, 1)                         # own (13/3, 17/3) fused 0.5 / 0.5 with the neighbour (9, 1)
    weighted = decide(ev, 4, 1, certainty_weighting=True)   # the neighbour at weight 0.5 * 2/3
    assert plain.scores == pytest.approx(((13 / 3 + 9) / 2, (17 / 3 + 1) / 2))
    w = 0.5 * (2 / 3)
    assert weighted.scores == pytest.approx(((0.5 * 13 / 3 + w * 9) / (0.5 + w), (0.5 * 17 / 3 + w * 1) / (0.5 + w)))
    certain = evidence()
    certain.samples = chain_scores(gen(chain(2, 8), chain(3, 8)))        # both B: c = 1, neighbours ignored
    assert decide(certain, 2, 1, certainty_weighting=True).scores == certain.samples.mean(2)
    assert decide(certain, 0, 1, certainty_weighting=True).predicted == "A"   # (0, n): the neighbours alone


def test_conclusion_placement_keeps_what_the_persona_concludes():
    from pr_rlhf.scaling.embedding import conclusion_text, placement_text, profile_vectors

    persona = "Example 1: +a -b > -a -b\nAgrees 1: A C\nVotes: A1 B0 C1\nType: A\nPrefers: +a -b\nFit: a1 b="
    assert conclusion_text(persona) == "Type: A\nPrefers: +a -b"
    assert conclusion_text("no conclusion here") == "no conclusion here"
    assert placement_text(persona, "persona") == persona
    with pytest.raises(ValueError, match="posts"):
        placement_text(persona, "profile")

    class Bag:
        name = "bag"

        def encode(self, texts):
            return np.array([[t.count("x"), t.count("y"), 1.0] for t in texts], dtype=float)
    vecs = profile_vectors({"u1": ["xx", "x"], "u2": ["y"], "u3": []}, Bag())
    assert set(vecs) == {"u1", "u2"} and np.linalg.norm(vecs["u1"]) == pytest.approx(1.0)
    assert vecs["u1"][0] > vecs["u1"][1] and vecs["u2"][1] > vecs["u2"][0]


def test_profile_placement_finds_neighbours_by_posts_and_a_mismatched_index_is_refused():
    """Members and looked-up users placed by their posts (as workers.scaling builds and looks up): a user who
    posts about x finds the x-posting members, one who posts about y the y-posting ones, whatever persona the
    judge wrote; their histories score the pair; a user without posts gets no neighbours."""
    from pr_rlhf.scaling.build import build_index
    from pr_rlhf.scaling.embedding import profile_vectors

    class Bag:
        name = "bag"

        def encode(self, texts):
            return np.array([[t.count("x"), t.count("y"), 0.1] for t in texts], dtype=float)
    posts = {"m1": ["xx", "x"], "m2": ["xxx", "xxy"], "m3": ["yy"], "m4": ["yyy", "xyy"],
             "ux": ["xxxx", "xy"], "uy": ["y", "yyy"], "silent": []}
    profiles = profile_vectors(posts, Bag())
    members = ["m1", "m2", "m3", "m4"]
    vectors = np.stack([profiles[u] for u in members])
    index = build_index(members, None, Bag(), 2, vectors=vectors, placement="profile")
    assert index.created["placement"] == "profile"
    assert index.labels[0] == index.labels[1] != index.labels[2] == index.labels[3]   # the x and the y members
    # the x members' histories make the fake judge prefer response 1, the y members' response 2
    histories = {"m1": [triple("likes-one")], "m2": [triple("likes-one")], "m3": [triple("y")], "m4": [triple("y")]}
    engine = FakeEngine()   # its personas ("likes two") hold neither x nor y: only the posts can place the users
    judge = ScaledJudge(engine, ScalingConfig(m=0, n=2, prototypes={"placement": "profile"}), index=index,
                        embedder=Bag(), histories=histories, profiles=profiles)
    users = ["ux", "uy", "m1", "m3", "silent"]
    inputs = [RMInput(pair_id=f"p-{u}", user_id=u, subset="s", question="q", chosen="good", rejected="bad",
                      history=[triple("own")]) for u in users]
    found = {ev.user_id: ev for ev in judge.evidence(inputs)}
    assert {u for u, _ in found["ux"].neighbours} == {"m1", "m2"}
    assert {u for u, _ in found["uy"].neighbours} == {"m3", "m4"}
    assert [u for u, _ in found["m1"].neighbours] == ["m2"] and [u for u, _ in found["m3"].neighbours] == ["m4"]
    assert found["silent"].neighbours == [] and found["silent"].neighbour_scores == []
    sims = [s for _, s in found["ux"].neighbours]
    assert sims == sorted(sims, reverse=True) and sims[0] > 0.9   # most similar first
    assert found["ux"].neighbour_scores == [(9.0, 1.0)] * 2 and found["uy"].neighbour_scores == [(1.0, 9.0)] * 2
    with pytest.raises(ValueError, match="exactly one"):
        build_index(["m1"], ["t"], Bag(), 1, vectors=vectors[:1])
    cfg = ScalingConfig(m=0, n=1, prototypes={"placement": "profile"})
    with pytest.raises(ValueError, match="profile vectors"):
        ScaledJudge(object(), cfg, index=index, embedder=Bag())
    with pytest.raises(ValueError, match="placement"):
        ScaledJudge(object(), ScalingConfig(m=0, n=1), index=index, embedder=Bag())
