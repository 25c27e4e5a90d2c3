"""The P-GenRM pipeline's parts (config, schedules, curriculum sampling, the ablation report) and, end to end
on Ray through the CLI, the RL stages from the shipped P-GenRM (CRE, curriculum, their evaluations, mlflow, the
ablation report, resume, test-time scaling). PSI from scratch is tests/e2e/test_psi_from_scratch.py."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from pr_rlhf.configs.pgenrm import GRPOStageConfig, WorldPSIConfig, pgenrm_config
from pr_rlhf.configs.recipe import load_recipe
from pr_rlhf.pgenrm.curriculum import hard_share_at, step_prompts
from tests.cli_subprocess import run_cli

ROOT = Path(__file__).resolve().parents[2]
# Hang timeouts of the CLI runs below (seconds)
HANG_RL_S, HANG_RESUME_S, HANG_SCALING_S = 2400, 900, 1800
CLI_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}   # the command's own loopback-only Ray


def test_psi_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = WorldPSIConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [cfg.lr_at(s) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))          # monotone decay after warm-up
    assert lrs[-1] == pytest.approx(1e-4)


def test_stage_configs_and_validation():
    cfg = pgenrm_config()
    assert cfg.stage_config("cre_no_pr").alpha == 0 and cfg.stage_config("cre_no_pr").beta == cfg.cre.beta
    assert cfg.stage_config("cre_no_or").beta == 0 and cfg.stage_config("cre_no_or").alpha == cfg.cre.alpha
    assert cfg.stage_config("curriculum").alpha == 0 and cfg.curriculum.hard_share_end > cfg.curriculum.hard_share_start
    with pytest.raises(ValueError, match="both"):
        GRPOStageConfig(hard_share_start=0.2)
    with pytest.raises(ValueError, match="alpha and beta"):
        GRPOStageConfig(alpha=0, beta=0)
    with pytest.raises(ValueError, match="advantage"):
        GRPOStageConfig(advantage="gae")   # GAE needs a critic the GenRM stages do not train
    with pytest.raises(ValueError, match="compact"):
        pgenrm_config(world={"rendering": "varied"})
    recipe = load_recipe(ROOT / "recipes" / "pgenrm_pipeline.yaml", ["pgenrm.cre.steps=3"])
    assert recipe.pgenrm.cre.steps == 3 and recipe.pgenrm.stages == ["base", "psi", "cre", "curriculum", "control"]
    assert recipe.pgenrm.psi.teacher == "recent_pair" and not recipe.pgenrm.psi.label_filter
    assert recipe.pgenrm.headroom.gate == "enforce" and recipe.pgenrm.cre.both_orders


def test_curriculum_share_rises_and_sampling_is_seeded():
    assert hard_share_at(0, 11, 0.2, 0.8) == pytest.approx(0.2)
    assert hard_share_at(5, 11, 0.2, 0.8) == pytest.approx(0.5)
    assert hard_share_at(10, 11, 0.2, 0.8) == pytest.approx(0.8)
    pool = list(range(100))
    hard = [i % 3 == 0 for i in pool]
    for step, want in ((0, 2), (10, 8)):
        picked = step_prompts(pool, hard, step, 10, seed=1, schedule=(0.2, 0.8, 11))
        assert sum(hard[i] for i in picked) == want and len(set(picked)) == 10
    assert step_prompts(pool, hard, 3, 10, 1) == step_prompts(pool, hard, 3, 10, 1)
    assert step_prompts(pool, hard, 3, 10, 1) != step_prompts(pool, hard, 4, 10, 1)
    # a refill draw never repeats what the step already drew, at the step's share
    for schedule in (None, (0.2, 0.8, 11)):
        first = step_prompts(pool, hard, 5, 16, 1, schedule)
        more = step_prompts(pool, hard, 5, 16, 1, schedule, draw=1, exclude=first)
        assert len(more) == 16 and not set(more) & set(first)
        assert schedule is None or sum(hard[i] for i in more) == sum(hard[i] for i in first) == 8
    with pytest.raises(ValueError, match="hard and standard"):
        step_prompts(pool, [False] * 100, 0, 10, 1, schedule=(0.5, 0.5, 2))
    # a refill draw: independent of the step's own draw, at the step's share; hard-only needs no standard prompts
    refill = step_prompts(pool, hard, 10, 10, 1, schedule=(0.2, 0.8, 11), draw=1)
    assert sum(hard[i] for i in refill) == 8 and refill != step_prompts(pool, hard, 10, 10, 1, (0.2, 0.8, 11))
    assert all(hard[i] for i in step_prompts(pool, hard, 0, 10, 1, schedule=(1.0, 1.0, 5), draw=2))


def test_paired_gain_and_report_from_stage_results(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pr_rlhf.eval.report import PairOutcomes
    from pr_rlhf.pgenrm.report import paired_gain, write_ablation_report

    users = {f"p{i}": f"u{i // 2}" for i in range(200)}
    old = PairOutcomes({f"p{i}": float(i % 2) for i in range(200)}, users)                  # 50% correct
    new = PairOutcomes({f"p{i}": 1.0 if i % 4 else old[f"p{i}"] for i in range(200)}, users)  # better on 50 pairs
    gain = paired_gain(new, old)
    assert gain["gain"] == pytest.approx(np.mean([new[p] - old[p] for p in old])) and gain["ci_low"] > 0
    assert gain["users"] == 100 and paired_gain(PairOutcomes({}, {}), old)["pairs"] == 0

    def stage(name: str, correct: dict) -> None:
        d = tmp_path / name
        result = {"stage": name, "train_seconds": 60.0}
        for group in ("seen", "cold"):
            path = d / f"eval_{group}" / "predictions.parquet"
            path.parent.mkdir(parents=True)
            pq.write_table(pa.table({"pair_id": list(correct), "user_id": [users[p] for p in correct],
                                     "correct": [bool(v) for v in correct.values()]}), path)
            acc = float(np.mean(list(correct.values())))
            result[group] = {"summary": {"accuracy": acc, "ci_low": acc - 0.05, "ci_high": acc + 0.05, "n": 200,
                                         "failures": 3, "failure_rate": 0.015},
                             "predictions": str(path), "hardness": {"hard": {"accuracy": acc}}}
        (d / "result.json").write_text(json.dumps(result))
        (d / "COMPLETE").write_text("ok\n")

    stage("base", {p: 0.0 for p in old})
    stage("psi", old)
    stage("cre", new)
    (tmp_path / "references.json").write_text(json.dumps(
        {"seen": {"oracle": {"accuracy": 0.8, "ci_low": 0.78, "ci_high": 0.82}}, "cold": {}}))
    report = write_ablation_report(tmp_path)
    assert [r["stage"] for r in report.rows] == ["cre", "psi", "base"]   # the paper's order, missing rows skipped
    assert report.rows[0]["seen"]["gain"]["gain"] == pytest.approx(gain["gain"])
    text = report.markdown.read_text()
    assert "w/o curriculum" in text and "world oracle (seen)" in text and report.figure.stat().st_size > 1000
    assert "0.83" in text   # normalized to the oracle: (75 - 50) / (80 - 50)

    # the curriculum beside its compute-matched control, paired on contested and other pairs
    (tmp_path / "contested.json").write_text(json.dumps({p: i < 100 for i, p in enumerate(old)}))
    control = dict(new)
    curriculum = {p: 1.0 if i < 100 else v for i, (p, v) in enumerate(new.items())}   # better on contested only
    stage("control", control)
    stage("curriculum", curriculum)
    report = write_ablation_report(tmp_path)
    comps = {(c["stage"], c["baseline"]): c for c in json.loads(report.json.read_text())["comparisons"]}
    assert set(comps) == {("cre", "psi"), ("curriculum", "control"), ("curriculum", "cre")}
    vs_control = comps[("curriculum", "control")]["seen"]
    assert vs_control["contested"]["pairs"] == 100 and vs_control["contested"]["ci_low"] > 0
    assert vs_control["rest"]["gain"] == 0.0 and vs_control["rest"]["changed"] == 0
    assert vs_control["contested"]["changed"] == sum(1 for i, p in enumerate(new) if i < 100 and new[p] == 0)
    assert "curriculum - control" in report.markdown.read_text()

    # a moved run directory pairs its own predictions, not the files its results recorded
    import shutil

    moved = tmp_path.parent / f"{tmp_path.name}_moved"
    shutil.copytree(tmp_path, moved)
    pq.write_table(pa.table({"pair_id": list(old), "user_id": [users[p] for p in old], "correct": [False] * len(old)}),
                   tmp_path / "psi" / "eval_seen" / "predictions.parquet")   # the recorded file changes
    cre_row = next(r for r in write_ablation_report(moved).rows if r["stage"] == "cre")
    assert cre_row["seen"]["gain"]["gain"] == pytest.approx(gain["gain"])


def test_stage_order_error_names_the_missing_parent(tmp_path):
    from pr_rlhf.configs.recipe import Recipe
    from workers.pgenrm import PGenRMPipeline, StageOrderError

    recipe = Recipe(pgenrm={"world": {"rendering": "compact", "users": 8, "cold_start_users": 2,
                                      "reference_samples": 200}, "out": str(tmp_path)})
    pipeline = PGenRMPipeline(recipe)
    with pytest.raises(StageOrderError, match="--stage psi"):
        pipeline.start_model("cre")
    with pytest.raises(StageOrderError, match="--stage cre"):
        pipeline.start_model("curriculum")
    # a stage the recipe starts from a given model needs no parent run
    from pr_rlhf.models.sources import resolve_model

    shipped = str(ROOT / "models" / "pgenrm_tiny")
    given = PGenRMPipeline(recipe.model_copy(update={"pgenrm": recipe.pgenrm.model_copy(
        update={"start_from": {"cre": shipped, "planner": shipped}})}))
    assert given.start_model("cre") == given.start_model("planner") == resolve_model(shipped)
    with pytest.raises(StageOrderError, match="--stage cre"):
        given.start_model("curriculum")
    with pytest.raises(ValueError, match="start_from.base"):
        pgenrm_config(start_from={"base": shipped})


def test_headroom_gate_refuses_rl_when_the_teacher_is_the_best_rule(tmp_path):
    """The vote teacher *is* the best rule on its inputs: the gate says no go, and an enforced gate refuses every
    GRPO stage (naming the report) while supervised stages run; the beatable teacher leaves room."""
    from pr_rlhf.configs.pgenrm import HeadroomConfig
    from pr_rlhf.configs.recipe import Recipe
    from workers.pgenrm import HeadroomGateError, PGenRMPipeline

    world = {"rendering": "compact", "n_attributes": 3, "n_archetypes": 3, "max_differing_attributes": 2,
             "users": 30, "cold_start_users": 4, "reference_samples": 500}
    recipe = Recipe(pgenrm={"world": world, "out": str(tmp_path / "votes"), "chain_style": "vote",
                            "headroom": {"gate": "enforce"}})
    pipeline = PGenRMPipeline(recipe)
    for stage in ("cre", "curriculum", "control", "cre_no_pr", "cre_no_or"):
        with pytest.raises(HeadroomGateError, match="headroom.json"):
            pipeline.check_gate(stage)
    pipeline.check_gate("psi")
    report = json.loads((tmp_path / "votes" / "headroom.json").read_text())
    assert report["gate"]["go"] is False and report["gate"]["rule_minus_teacher"] == 0.0
    events = []
    warned = PGenRMPipeline(recipe.model_copy(update={"pgenrm": recipe.pgenrm.model_copy(
        update={"headroom": HeadroomConfig(gate="warn")})}), on_event=events.append)
    warned.check_gate("cre")
    assert any("no go" in e for e in events)
    beatable = Recipe(pgenrm={"world": world, "out": str(tmp_path / "beat"), "chain_style": "vote",
                              "psi": {"teacher": "recent_pair"}, "headroom": {"gate": "enforce"}})
    gate = PGenRMPipeline(beatable).data.headroom.offline()["gate"]   # on this small world the contested gap is smaller
    assert gate["rule_minus_teacher"] > 0.05 and gate["rule_minus_teacher_contested"] > 0.1, gate


def pgenrm_cli(recipe: str, out: Path, tmp_path: Path, *, sets=(), stages=(), hang_timeout_s: float):
    """`pr-rlhf pgenrm RECIPE` as a user runs it, in its own process session (see tests/cli_subprocess.py)."""
    args = ["pgenrm", str(ROOT / "recipes" / recipe), "--out", str(out), "--set", f"pgenrm.shards={tmp_path / 'data'}"]
    for s in sets:
        args += ["--set", s]
    for stage in stages:
        args += ["--stage", stage]
    return run_cli(args, cwd=tmp_path, env=CLI_ENV, hang_timeout_s=hang_timeout_s)


def stage_results(out: Path, stages) -> dict:
    return {s: json.loads((out / s / "result.json").read_text()) for s in stages}


def written_at(out: Path, stages) -> dict:
    return {s: (out / s / "result.json").stat().st_mtime_ns for s in stages}


def assert_not_run_again(run, out: Path, stages, written: dict) -> None:
    text = " ".join(run.stdout.split())   # the console wraps long lines (the run paths) at 80 columns
    assert run.returncode == 0 and text.count("not run again") == len(stages), text[-2000:]
    assert written_at(out, stages) == written


# Hang timeouts: several times the slowest 2-core class's measured time (docs/testing.md), never a time a correct run
# can reach there. (PSI from scratch: tests/e2e/test_psi_from_scratch.py, a file of its own so that parallel
# workers run it beside this one.)
@pytest.mark.timeout(HANG_RL_S + HANG_RESUME_S + HANG_SCALING_S + 600)
def test_rl_stages_from_the_shipped_genrm_run_resume_and_scale(tmp_path):
    """CRE and the curriculum from the shipped P-GenRM (no PSI run): both GRPO stages train on Ray with process and
    outcome rewards, the curriculum's hard share rises, each stage is evaluated and logged, the ablation report is
    written, a rerun runs nothing again, and test-time scaling runs on the result. The rollout engines are colocated
    with the learner ranks (the GPU recipes' layout): each step's engines sleep around the update."""
    out = tmp_path / "run"
    stages = ("cre", "curriculum")
    shipped = ROOT / "models" / "pgenrm_tiny"
    sets = [f"pgenrm.start_from.cre={shipped}", "pgenrm.layout=colocated"]
    run = pgenrm_cli("pgenrm_from_shipped.yaml", out, tmp_path, sets=sets, hang_timeout_s=HANG_RL_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = stage_results(out, stages)
    for stage in stages:
        history = json.loads((out / stage / "history.json").read_text())
        assert len(history) == 2 and all("reward/outcome" in h and "reward/process" in h for h in history)
        assert all(h["time/sleep_s"] >= 0 and h["time/wake_s"] >= 0 for h in history)   # colocated
        seen = results[stage]["seen"]["summary"]
        # two small GRPO steps keep the shipped model's accuracy (87.7% on 600 pairs): above chance beyond its CI
        assert seen["n"] == 40 and seen["ci_low"] > 0.5, seen
        assert results[stage]["cold"]["summary"]["n"] == 16
    curriculum = json.loads((out / "curriculum" / "history.json").read_text())
    assert curriculum[0]["data/hard_share"] < curriculum[-1]["data/hard_share"]       # contested prompts rise
    cre = json.loads((out / "cre" / "history.json").read_text())
    for h in cre:   # the RL step's diagnostics: zero-variance share, refill, slot share, decision entropy
        assert 0.0 <= h["reward/frac_zero_std"] <= 1.0 and 0.0 <= h["decision/first_slot_share"] <= 1.0
        assert h["rollout/update_groups"] >= 1 and "rollout/refill_groups" in h
        assert h["decision/entropy_mc"] >= 0.0 and "reward/outcome_contested" in h
    headroom = json.loads((out / "headroom.json").read_text())   # written before any stage
    assert headroom["teacher"] == "recent_pair" and headroom["gate"]["go"]
    assert abs(headroom["groups"]["seen"]["best_rule"]["all"] - 0.884) < 0.01     # the docs' offline numbers
    assert "### Headroom" in (out / "ablation.md").read_text()
    assert (out / "ablation.md").is_file() and (out / "ablation.png").is_file()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'cre' / 'mlflow.db'}")
    (mrun,) = client.search_runs([client.get_experiment_by_name("pgenrm_from_shipped").experiment_id],
                                 filter_string="tags.stage = 'pgenrm/cre'")
    assert "reward/outcome" in mrun.data.metrics and "seen/accuracy" in mrun.data.metrics

    written = written_at(out, stages)
    again = pgenrm_cli("pgenrm_from_shipped.yaml", out, tmp_path, sets=sets,
                       hang_timeout_s=HANG_RESUME_S)
    assert_not_run_again(again, out, stages, written)

    # test-time scaling of the trained GenRM, on Ray, from a recipe: a small grid (8 + 8 pairs, 2 chains, 2
    # neighbours); the prototypes it saves load back for the same embedder
    import yaml

    from pr_rlhf.scaling.index import PrototypeIndex

    world = load_recipe(ROOT / "recipes" / "pgenrm_from_shipped.yaml").pgenrm.world.model_dump(mode="json")
    scaling_recipe = tmp_path / "scaling.yaml"
    scaling_recipe.write_text(yaml.safe_dump({"name": "scaling_smoke", "scaling": {
        "model": str(out / "curriculum" / "model"), "shards": str(tmp_path / "data"), "world": world,
        "points": [[0, 0], [2, 0], [2, 2], [0, 2]], "seen_pairs": 8, "cold_pairs": 8, "out": str(tmp_path / "sc"),
        "scaling": {"prototypes": {"k": 4, "refine_steps": 10, "candidate_ks": [2, 4]}}}}))
    grid = run_cli(["scaling", str(scaling_recipe)], cwd=tmp_path, env=CLI_ENV, hang_timeout_s=HANG_SCALING_S)
    assert grid.returncode == 0, grid.stdout[-3000:] + grid.stderr[-3000:]
    report = json.loads((tmp_path / "sc" / "scaling_grid.json").read_text())
    assert {(r["group"], r["m"], r["n"]) for r in report["rows"]} == {
        (g, m, n) for g in ("seen", "cold") for m, n in ((0, 0), (2, 0), (2, 2), (0, 2))}
    plain = next(r for r in report["rows"] if r["group"] == "seen" and (r["m"], r["n"]) == (0, 0))
    assert plain["pairs"] == 8 and plain["no_verdict"] <= 1 and report["member_users"] >= 4
    assert set(report["explained_variance"]) == {"2", "4"} and (tmp_path / "sc" / "scaling_grid.png").is_file()
    index = PrototypeIndex.load(tmp_path / "sc" / "prototypes", expected_embedder=report["embedder"])
    assert index.k == 4 and index.refined and len(index.user_ids) == report["member_users"]
