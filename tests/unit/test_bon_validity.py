"""Reward models of known benchmark accuracy (the world's reference predictors as scorers), the compact response
view of a tiny GenRM, and the benchmark-validity report (`pr-rlhf report correlation`)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pr_rlhf.bon.correlation import correlation_report, load_bon, write_correlation_report
from pr_rlhf.configs.bon import BoNConfig
from pr_rlhf.configs.reward import reward_config
from pr_rlhf.eval.benchmark import read_accuracy
from pr_rlhf.models.base import Generation, Sample
from pr_rlhf.scorers import GenRMScorer, RewardRequest, WorldEstimateScorer
from pr_rlhf.world import WorldConfig, build_world
from pr_rlhf.world.reference import REFERENCES, estimate_accuracy, estimated_weights, reference_accuracies

WORLD = WorldConfig(rendering="compact", n_attributes=3, n_archetypes=3, max_differing_attributes=2, users=30,
                    cold_start_users=6, reference_samples=600)


@pytest.fixture(scope="module")
def world():
    return build_world(WORLD)


def scorer_accuracy(scorer, world, users="seen") -> float:
    """The scorer's pairwise accuracy on the world's held-out (val + test) pairs from their texts alone."""
    points = []
    for user in world.users:
        if user.cold_start != (users == "cold_start"):
            continue
        for p in (p for p in world.pairs_of(user.user_id) if p.split in ("val", "test")):
            (c, _), (r, _) = scorer.score([RewardRequest("c", p.user_id, p.question, p.chosen),
                                           RewardRequest("r", p.user_id, p.question, p.rejected)])
            points.append(1.0 if c > r else 0.0 if c < r else 0.5)
    return float(np.mean(points))


@pytest.mark.parametrize("estimator", REFERENCES)
def test_world_estimate_scorer_reaches_its_computed_benchmark_accuracy(world, estimator):
    scorer = WorldEstimateScorer(reward_config(kind="world_estimate", estimator=estimator, world=WORLD))
    for users in ("seen", "cold_start"):
        measured = scorer_accuracy(scorer, world, users)
        assert measured == pytest.approx(estimate_accuracy(world, estimator, 3, users=users).accuracy)
        if estimator in ("true_weights", "logistic_regression"):   # same decision rule as the reference
            assert measured == pytest.approx(reference_accuracies(world, 3, users=users)[estimator].accuracy)


def test_estimates_are_ordered_by_knowledge(world):
    acc = {e: estimate_accuracy(world, e, 3).accuracy for e in REFERENCES}
    assert acc["true_weights"] >= acc["oracle"] > acc["no_history"]
    user = world.users[0].user_id
    assert np.allclose(estimated_weights(world, user, "true_weights"), world.user(user).weights)
    prior = estimated_weights(world, user, "no_history")
    assert np.allclose(prior, estimated_weights(world, world.users[1].user_id, "no_history"))  # same for all
    with pytest.raises(ValueError, match="unknown reference predictor"):
        estimated_weights(world, user, "psychic")


def test_world_estimate_unknown_user_is_an_error_not_a_score():
    scorer = WorldEstimateScorer(reward_config(kind="world_estimate", world=WORLD))
    assert scorer.score([RewardRequest("x", "nobody", "Q?", "A.")])[0][0] is None


class CapturingEngine:
    name = "capture"

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, params):
        self.prompts += prompts
        return [Generation(samples=[Sample(text="nothing parseable")]) for _ in prompts]

    def close(self):
        pass


def test_world_compact_view_shows_the_measured_attributes():
    engine = CapturingEngine()
    cfg = reward_config(kind="genrm", sec_format="sec_compact", response_view="world_compact", world=WORLD)
    answer = "Great idea! For example:\n- pick a film\n- invite friends"
    scores = GenRMScorer(cfg, engine=engine).score(
        [RewardRequest("a", "u", "How?", answer, {"reference": "Just do it."})])
    assert scores[0][0] is None and scores[0][1]            # unparseable chain: an error, never a score
    text = engine.prompts[0][-1]["content"]
    assert answer not in text and "- e.g." in text and "- great!" in text   # the compact rendering, as trained
    assert "prose abstract calm" in text                                    # the reference: no attributes


def test_benchmark_accuracy_from_numbers_or_result_files(tmp_path):
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"seen": {"summary": {"accuracy": 0.875}}}))
    assert read_accuracy(0.5) == 0.5 and read_accuracy(f"{result}:seen") == 0.875
    with pytest.raises(ValueError, match="seen"):
        read_accuracy(f"{result}:cold")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_accuracy(f"{tmp_path}/missing.json:seen")
    own = tmp_path / "eval_result.json"   # a `pr-rlhf eval` result: its own summary, no group
    own.write_text(json.dumps({"summary": {"accuracy": 0.625}, "predictions": []}))
    assert read_accuracy(str(own)) == 0.625
    metrics = tmp_path / "metrics.json"   # a `pr-rlhf eval` run's metrics: one summary per (mode, inputs) cell
    metrics.write_text(json.dumps({"groups": {"pairwise/none": {"accuracy": 0.843}}, "n_pairs": 1500}))
    assert read_accuracy(f"{metrics}:pairwise/none") == 0.843
    with pytest.raises(ValueError, match="groups.pointwise/none.accuracy"):
        read_accuracy(f"{metrics}:pointwise/none")
    rms = {"a": reward_config(kind="gold")}
    with pytest.raises(ValueError, match="benchmark_accuracy.a"):
        BoNConfig(reward_models=rms, benchmark_accuracy={"a": 1.5})
    with pytest.raises(ValueError, match="neither a number"):
        BoNConfig(reward_models=rms, benchmark_accuracy={"a": "high"})


def bon_json(bench: dict, top: dict) -> dict:
    """A sweep's bon.json with curves at k = 1 (all equal) and k = 4 (``top``)."""
    curves = {rm: [{"subset": "all", "k": 1, "mean": 0.5}, {"subset": "all", "k": 4, "mean": q},
                   {"subset": "x", "k": 4, "mean": 0.0}] for rm, q in top.items()}
    return {"curves": curves, "benchmark_accuracy": bench}


def test_correlation_report_ranks_and_files(tmp_path):
    bench = {"a": 0.9, "b": 0.8, "c": 0.6}
    agree = correlation_report([bon_json(bench, {"a": 0.9, "b": 0.7, "c": 0.6})])
    by_column = {a.downstream: a for a in agree.agreements}
    assert agree.skipped == [] and set(by_column) == {"best_of_1", "best_of_4"}
    assert np.isnan(by_column["best_of_1"].spearman_rho)     # every RM equal downstream: no ranking
    assert by_column["best_of_4"].spearman_rho == pytest.approx(1.0)
    assert by_column["best_of_4"].ndcg_minmax == pytest.approx(1.0)
    reverse = correlation_report([bon_json(bench, {"a": 0.5, "b": 0.7, "c": 0.9})],
                                 extra={"ppo_gold": {"a": 3.0, "b": 2.0}, "lonely": {"a": 1.0}})
    by_column = {a.downstream: a for a in reverse.agreements}
    assert by_column["best_of_4"].spearman_rho == pytest.approx(-1.0) and by_column["best_of_4"].ndcg_zscore < 0
    assert by_column["ppo_gold"].spearman_rho == pytest.approx(1.0) and reverse.skipped == ["lonely"]
    md = write_correlation_report(reverse, tmp_path)
    assert "| best_of_4 | 3 | -1.000" in md.read_text()
    assert (tmp_path / "correlation.png").is_file() and json.loads((tmp_path / "correlation.json").read_text())


def test_report_correlation_command(tmp_path):
    from typer.testing import CliRunner

    from pr_rlhf.cli import app

    run = tmp_path / "bon"
    run.mkdir()
    (run / "bon.json").write_text(json.dumps(bon_json({"a": 0.9, "b": 0.6}, {"a": 0.8, "b": 0.4})))
    extra = tmp_path / "ppo.json"
    extra.write_text(json.dumps({"ppo_gold": {"a": 1.0, "b": 0.0}}))
    out = CliRunner().invoke(app, ["report", "correlation", str(run), "--extra", str(extra)])
    assert out.exit_code == 0, out.output
    assert "ppo_gold" in (run / "correlation.md").read_text()
    missing = CliRunner().invoke(app, ["report", "correlation", str(tmp_path / "nowhere")])
    assert missing.exit_code != 0 and "no bon.json" in missing.output
    assert load_bon(run)["benchmark_accuracy"] == {"a": 0.9, "b": 0.6}
