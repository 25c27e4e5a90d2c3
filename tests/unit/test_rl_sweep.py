"""The RL sweep's config, its report and the population-agreement split, on hand-written run folders (no Ray)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from pr_rlhf.bon.correlation import correlation_report
from pr_rlhf.configs.rl import RLSweepConfig
from pr_rlhf.rl.compare import DOWNSTREAM, OWN, agreement_groups, compare_runs
from pr_rlhf.rl.sweep import sweep_rows, write_sweep_report
from pr_rlhf.world import WorldConfig, build_world
from pr_rlhf.world.reference import population_agreement

WORLD = WorldConfig(rendering="compact", n_attributes=3, n_archetypes=3, users=12, cold_start_users=8,
                    shared_preference=0.7, reference_samples=300)


def test_population_agreement_is_the_cosine_with_the_population_preference():
    world = build_world(WORLD)
    cosine = population_agreement(world)
    assert set(cosine) == {u.user_id for u in world.users}
    assert all(-1.0 <= c <= 1.0 for c in cosine.values())
    assert min(cosine.values()) < max(cosine.values())
    # with a shared taste most users agree with the population
    assert np.mean([c > 0 for c in cosine.values()]) > 0.5


def test_sweep_config_checks_its_arms():
    arms = {"gold": {"kind": "gold"}, "prior": {"kind": "world_estimate", "estimator": "no_history"}}
    cfg = RLSweepConfig.model_validate({"arms": arms, "baseline": "prior", "benchmark_accuracy": {"gold": 0.9}})
    assert cfg.arms["prior"].kind == "world_estimate"
    with pytest.raises(ValidationError, match="baseline 'none' is not an arm"):
        RLSweepConfig.model_validate({"arms": arms, "baseline": "none"})
    with pytest.raises(ValidationError, match="names arms not in arms"):
        RLSweepConfig.model_validate({"arms": arms, "baseline": "prior", "benchmark_accuracy": {"rm": 0.7}})
    with pytest.raises(ValidationError, match="not an accuracy"):
        RLSweepConfig.model_validate({"arms": arms, "baseline": "prior", "benchmark_accuracy": {"gold": 1.5}})


def fake_run(folder, users, first, last, shards=None):
    """A finished run folder: history.json with two evaluations, and the recipe naming its shards."""
    folder.mkdir(parents=True)
    evals = [{"step": step, OWN: list(values), DOWNSTREAM: list(values)} for step, values in ((0, first), (10, last))]
    (folder / "history.json").write_text(json.dumps({"history": [], "evals": evals, "heldout_users": users}))
    (folder / "recipe.yaml").write_text(yaml.safe_dump({"train": {"data": {"shards": str(shards or folder)}}}))
    return folder


@pytest.fixture(scope="module")
def world_shards(tmp_path_factory):
    from pr_rlhf.shards import write_shards

    path = tmp_path_factory.mktemp("shards")
    write_shards(path, {}, source="synthetic", config={"world": WORLD.model_dump(mode="json")})
    return path


def test_sweep_report_pairs_arms_with_the_baseline_per_agreement_group(world_shards, tmp_path):
    cosine = population_agreement(build_world(WORLD))
    agree = [u for u, c in cosine.items() if c > 0][:3]
    disagree = [u for u, c in cosine.items() if c <= 0][:3]
    users = agree + disagree
    start = [0.0] * 6
    # the personalized arm gains only for users who disagree with the population; the global arm only for the others
    fake_run(tmp_path / "personal", users, start, [0.5, 0.5, 0.5, 1.0, 1.1, 0.9], world_shards)
    fake_run(tmp_path / "global", users, start, [0.6, 0.6, 0.6, -0.5, -0.6, -0.4], world_shards)
    assert agreement_groups(tmp_path / "personal") == {"agree": [0, 1, 2], "disagree": [3, 4, 5]}
    row = compare_runs(tmp_path / "personal", tmp_path / "global")
    assert row["gain"] == pytest.approx(np.mean([-0.1] * 3 + [1.5, 1.7, 1.3]))
    assert row["groups"]["disagree"]["gain"] == pytest.approx(1.5) and row["groups"]["disagree"]["ci_low"] > 0
    assert row["groups"]["agree"]["gain"] == pytest.approx(-0.1)

    rows = sweep_rows(tmp_path, ["personal", "global"], "global", {"personal": 0.7, "global": 0.55})
    assert "vs_baseline" not in rows["global"] and rows["personal"]["benchmark_accuracy"] == 0.7
    assert rows["personal"]["rise"]["gain"] == pytest.approx(np.mean([0.5, 0.5, 0.5, 1.0, 1.1, 0.9]))
    files = write_sweep_report(tmp_path, rows, "global", "test sweep")
    text = files.markdown.read_text()
    assert "| personal | 70.0 |" in text and "(baseline)" in text and "(n=3)" in text
    assert json.loads(files.json.read_text())["arms"]["personal"]["vs_baseline"]["groups"]["agree"]["prompts"] == 3
    assert files.figure.stat().st_size > 0


def test_a_run_without_a_world_has_no_agreement_groups(tmp_path):
    fake_run(tmp_path / "a", ["u1", "u2"], [0.0, 0.0], [1.0, 2.0], shards=tmp_path / "missing")
    fake_run(tmp_path / "b", ["u1", "u2"], [0.0, 0.0], [0.0, 1.0], shards=tmp_path / "missing")
    row = compare_runs(tmp_path / "a", tmp_path / "b")
    assert row["groups"] == {} and row["gain"] == pytest.approx(1.0)


def test_correlation_report_takes_benchmark_accuracies_without_a_bon_sweep():
    report = correlation_report([], {"grpo_downstream": {"a": 0.1, "b": 0.3, "c": 0.2}},
                                benchmark={"a": 0.5, "b": 0.9, "c": 0.7})
    (agreement,) = report.agreements
    assert agreement.spearman_rho == pytest.approx(1.0) and agreement.ndcg_minmax == pytest.approx(1.0)
