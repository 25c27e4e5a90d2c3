"""`pr-rlhf data build` / `data inspect` / `quickstart` end to end, determinism, bad input through the CLI,
the world's raw exports read back by the real loaders, and one-way imports."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipelines import personal_rewardbench, prb
from data_pipelines.build import build_shards
from data_pipelines.synthetic import export_personal_rewardbench, export_prb
from pr_rlhf.configs.recipe import data_config
from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.shards import ShardReader
from pr_rlhf.world.generator import build_world
from tests import cli_subprocess
from tests.fixtures_raw import prb_row, question_defects, write_prb

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "pr_rlhf.cli"]
SMALL_WORLD = ["world.users=12", "world.cold_start_users=4", "world.reference_samples=500"]


def run_cli(*args: str, hang_timeout_s: float = 500) -> subprocess.CompletedProcess:
    return cli_subprocess.run_cli(list(args), hang_timeout_s=hang_timeout_s)


def test_synthetic_build_is_deterministic_and_retrieves_own_items(tmp_path):
    world = WorldConfig(users=10, cold_start_users=3, reference_samples=500)
    manifests = [build_shards(data_config(source="synthetic", out=str(tmp_path / n)), world).manifest
                 for n in ("a", "b")]
    assert [f["sha256"] for f in manifests[0]["files"]] == [f["sha256"] for f in manifests[1]["files"]]
    assert (tmp_path / "a/manifest.json").read_bytes() == (tmp_path / "b/manifest.json").read_bytes()
    reader = ShardReader(tmp_path / "a", verify=True)
    profiles = {row["user_id"]: {i["id"]: i["text"] for i in row["items"]} for row in reader.iter_rows("profiles")}
    pairs = list(reader.iter_rows("pairs"))
    assert pairs and all(len(p["retrieved"]) == min(10, len(profiles[p["user_id"]])) for p in pairs)
    for p in pairs:  # every retrieved item is the user's own item, with its own text
        assert all(profiles[p["user_id"]][it["id"]] == it["text"] for it in p["retrieved"])
    other = build_shards(data_config(source="synthetic", out=str(tmp_path / "c")), world.model_copy(update={"seed": 1}))
    assert other.manifest["files"][0]["sha256"] != manifests[0]["files"][0]["sha256"]
    assert manifests[0]["summary"]["reference"]["oracle"]["n"] > 0


def test_cli_build_and_inspect_synthetic(tmp_path):
    out = tmp_path / "shards"
    res = run_cli("data", "build", "--source", "synthetic", "--out", str(out), "--embedder", "bm25",
                  "--top-k", "4", "--set", "world.rendering=compact", *sum((["--set", s] for s in SMALL_WORLD), []))
    assert res.returncode == 0, res.stderr
    assert "oracle" in res.stdout and "pairs" in res.stdout
    reader = ShardReader(out)
    assert reader.manifest["config"]["retrieval"]["top_k"] == 4
    assert all(len(p["retrieved"]) == 4 for p in reader.iter_rows("pairs"))
    res = run_cli("data", "inspect", str(out))
    assert res.returncode == 0, res.stderr
    assert "content hashes match" in res.stdout and "histories" in res.stdout


def test_cli_bad_prb_input_stops_or_skips_without_losing_valid_records(tmp_path):
    valid = [prb_row(f"ok-{i}") for i in range(5)]
    broken = question_defects(prb_row, "bad")
    raw = write_prb(tmp_path / "prb", {"Art_and_Entertainment": valid[:3] + [broken[0][0]] + valid[3:],
                                       "Society_and_Culture": [b for b, _ in broken[1:]]})
    res = run_cli("data", "build", "--source", "prb", "--input", str(raw), "--out", str(tmp_path / "o1"),
                  "--embedder", "bm25")
    assert res.returncode == 2
    assert "test-00000-of-00001.parquet" in res.stderr and "bad-noq" in res.stderr and "question" in res.stderr
    res = run_cli("data", "build", "--source", "prb", "--input", str(raw), "--out", str(tmp_path / "o2"),
                  "--embedder", "bm25", "--skip-invalid")
    assert res.returncode == 0, res.stderr
    assert f"skipped {len(broken)} invalid records" in res.stdout
    reader = ShardReader(tmp_path / "o2")
    assert sorted(p["pair_id"] for p in reader.iter_rows("pairs")) == sorted(r["id"] for r in valid)
    assert reader.manifest["skipped"] == len(broken)
    assert len((tmp_path / "o2/issues.jsonl").read_text().splitlines()) == len(broken)


def test_world_exports_load_through_the_real_loaders(tmp_path):
    world = build_world(WorldConfig(users=10, cold_start_users=3))
    export_prb(world, tmp_path / "prb")
    out = prb.load(str(tmp_path / "prb"))
    test_pairs = [p for p in world.pairs if p.split == "test"]
    assert out.skipped == 0 and len(out.tables["pairs"]) == len(test_pairs)
    by_id = {p.pair_id: p for p in test_pairs}
    assert all(by_id[p.pair_id].chosen == p.chosen for p in out.tables["pairs"])

    export_personal_rewardbench(world, tmp_path / "chatbot_arena")
    out = personal_rewardbench.load(str(tmp_path / "chatbot_arena"))
    assert out.skipped == 0 and len(out.tables["pairs"]) == len(world.pairs)
    cold = {h.user_id for h in out.tables["histories"] if h.cold_start}
    assert cold == {u.user_id for u in world.users if u.cold_start}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "pr_rlhf").rglob("*.py")), ids=lambda p: p.name)
def test_library_never_imports_workers_or_pipelines(path):
    if ROOT / "pr_rlhf" / "cli" in path.parents:  # the entry point dispatches to them (lazily, inside commands)
        return
    assert not _imports(path) & {"workers", "data_pipelines"}


@pytest.mark.timeout(1800)   # a hang: ~1.5 min on a fast 2-core machine, twice that on a slow one
def test_quickstart_runs_every_stage(tmp_path):
    """The README's full tour (the main job plus scaling and Best-of-N), shrunk: shards, every evaluation cell,
    the brief PSI, scaling, Best-of-N, then the GRPO stage on its own world."""
    out = tmp_path / "qs"
    world = [f"pgenrm.world.{key}" for key in ("users=12", "cold_start_users=4", "reference_samples=300")]
    sets = [*SMALL_WORLD, "eval.max_pairs=6", "data.retrieval.embedder=bm25", "train.steps=2",
            "train.eval_every=2", "train.warmup_sft_steps=2", "train.data.heldout_prompts=4", "train.eval_samples=2",
            *world, "pgenrm.psi.steps=2", "pgenrm.eval.seen_pairs=4", "pgenrm.eval.cold_pairs=4",
            "pgenrm.eval.max_tokens=24",
            "scaling.points=[[0,0],[2,2]]", "scaling.seen_pairs=4", "scaling.cold_pairs=4",
            "scaling.scaling.prototypes.k=2", "scaling.scaling.prototypes.candidate_ks=[2]",
            "scaling.scaling.prototypes.refine_steps=2", "bon.policy.model=tiny", "bon.prompts=2", "bon.n=4",
            "bon.max_tokens=8", "bon.reward_models.pgenrm_shipped.generation.max_tokens=24",
            "eval.models.pgenrm.generation.max_tokens=24"]
    done = run_cli("quickstart", "--out", str(out), "--recipe", str(ROOT / "recipes" / "quickstart_full.yaml"),
                   *[a for s in sets for a in ("--set", s)], hang_timeout_s=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "data" / "manifest.json").is_file() and (out / "eval" / "report.md").is_file()
    assert (out / "rl_world" / "manifest.json").is_file() and (out / "rl" / "history.json").is_file()
    assert "held-out reward" in done.stdout
    # one mlflow store for the whole job: every stage's run plus the quickstart's own summary run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id], max_results=100)
    stages = {r.data.tags.get("stage") for r in runs}
    assert {"quickstart", "eval", "pgenrm/base", "pgenrm/psi", "scaling", "bon", "rl/grpo"} <= stages, stages
    (top,) = [r for r in runs if r.data.tags.get("stage") == "quickstart"]
    assert top.data.metrics["quickstart/minutes"] > 0 and "quickstart/minutes/grpo" in top.data.metrics
    assert not list(out.rglob("*/mlflow.db")), "a stage wrote its own mlflow store"
    for stage in ("base", "psi"):
        assert (out / "pgenrm" / stage / "COMPLETE").is_file(), stage
    summary = json.loads((out / "summary.json").read_text())
    results = {s["stage"]: s["result"] for s in summary["stages"]}
    assert "psi after 2 PSI steps" in results["P-GenRM PSI (brief)"]
    assert "base on the same pairs" in results["P-GenRM PSI (brief)"]
    # the shipped trained models beside the untrained floor, each with its paired gain
    assert all(f"{name} " in results["evaluation"] and "over untrained" in results["evaluation"]
               for name in ("bt_rm_none", "bt_rm_profile", "bt_rm_plan", "pgenrm"))
    assert (out / "eval" / "models.md").is_file() and (out / "eval" / "models" / "pgenrm" / "report.md").is_file()
    assert (out / "scaling" / "scaling_grid.md").is_file() and (out / "scaling" / "scaling_grid.png").is_file()
    assert (out / "bon" / "bon.json").is_file() and (out / "bon" / "correlation.md").is_file()
    assert [s["stage"] for s in summary["stages"]][-1] == "GRPO" and summary["peak_rss_gb"] > 0
    assert "quickstart summary" in done.stdout
    check_quickstart_values(out, results)


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def check_quickstart_values(out: Path, results: dict) -> None:
    """Each stage's values in its own outputs, recomputed where they derive from per-pair rows, and the summary's
    line of each stage saying those values (sizes: test_quickstart_runs_every_stage's --set)."""
    import math

    import pyarrow.parquet as pq

    pairs = 6                                              # eval.max_pairs
    floor = {g: s for g, s in json.loads((out / "eval" / "metrics.json").read_text())["groups"].items()}
    assert set(floor) == {f"{m}/{i}" for m in ("pointwise", "pairwise") for i in ("none", "profile", "plan")}
    for cell, s in floor.items():
        assert s["n"] == pairs and 0 <= s["accuracy"] <= 1 and s["n_correct"] == round(s["accuracy"] * pairs), cell
    rows = {r["model"]: r for r in json.loads((out / "eval" / "models.json").read_text()) if "vs_floor" in r}
    assert {m: r["cell"] for m, r in rows.items()} == {
        "bt_rm_none": "pointwise/none", "bt_rm_profile": "pointwise/profile", "bt_rm_plan": "pointwise/plan",
        "pgenrm": "pairwise/none"}
    for model, row in rows.items():
        s, gain = row["summary"], row["vs_floor"]
        verdicts = pq.read_table(out / "eval" / "models" / model / "predictions.parquet").to_pylist()
        assert len(verdicts) == s["n"] == gain["pairs"] == pairs, model
        assert s["accuracy"] == sum(v["correct"] for v in verdicts) / pairs, model       # from its own verdicts
        if model.startswith("bt_rm"):       # a scalar RM: correct where the chosen response scores higher
            assert all(v["correct"] == (v["score_chosen"] > v["score_rejected"]) for v in verdicts), model
        # the paired gain over the untrained floor's cell on the same pairs
        assert gain["gain"] == pytest.approx(s["accuracy"] - floor[row["cell"]]["accuracy"]), model
        assert f"{model} {row['cell']} {pct(s['accuracy'])} (" in results["evaluation"], model
    # the shipped BT RM w/ profile beats chance and the untrained floor (5 of the 6 pairs; the floor 3)
    assert rows["bt_rm_profile"]["summary"]["accuracy"] > 0.5 and rows["bt_rm_profile"]["vs_floor"]["gain"] > 0

    # the brief PSI: the untrained GenRM parses nothing; each stage on the pairs asked for (4 seen, 4 cold)
    stages = {st: json.loads((out / "pgenrm" / st / "result.json").read_text()) for st in ("base", "psi")}
    for st, result in stages.items():
        for group in ("seen", "cold"):
            s = result[group]["summary"]
            assert s["n"] == 4 and 0 <= s["accuracy"] <= 1 and s["failures"] <= 4, (st, group)
    assert stages["base"]["seen"]["summary"]["failure_rate"] == stages["base"]["cold"]["summary"]["failure_rate"] == 1
    psi = stages["psi"]["seen"]["summary"]
    assert (f"seen {pct(psi['accuracy'])} ({psi['ties']} ties, {psi['failures']} unparsed of 4)"
            in results["P-GenRM PSI (brief)"])
    assert "base on the same pairs 50.0% with unparsed and ties as coin flips (4 unparsed)" in results[
        "P-GenRM PSI (brief)"]

    # test-time scaling: every (group, m, n) asked for, on its pairs
    grid = json.loads((out / "scaling" / "scaling_grid.json").read_text())["rows"]
    assert [(r["group"], r["m"], r["n"], r["pairs"]) for r in grid] == [
        (g, m, m, 4) for g in ("seen", "cold") for m in (0, 2)]
    assert all(0 <= r["accuracy"] <= 1 for r in grid)
    assert results["test-time scaling"] == ", ".join(f"{r['group']} ({r['m']},{r['n']}) {100 * r['accuracy']:.1f}"
                                                     for r in grid)

    # Best-of-N: every reward model's best-of-k for k = 1, 2, 4 on both prompts, a normalized gold utility
    bon = json.loads((out / "bon" / "bon.json").read_text())
    models = {"true_weights", "oracle", "logistic_regression", "prior_only", "pgenrm_shipped"}
    assert set(bon["curves"]) == models and all(c["prompts"] == 2 for c in bon["counts"].values())
    for name, curve in bon["curves"].items():
        overall = [c for c in curve if c["subset"] == "all"]
        assert [c["k"] for c in overall] == [1, 2, 4] and all(c["prompts"] == 2 for c in overall), name
        assert all(0 <= c["mean"] <= 1 and c["ci_low"] <= c["mean"] <= c["ci_high"] for c in curve), name
    truth = [c["mean"] for c in bon["curves"]["true_weights"] if c["subset"] == "all"]
    assert truth == sorted(truth)       # picking by the downstream judge's own utility never loses with k
    assert all(0 <= a <= 1 for a in bon["benchmark_accuracy"].values())

    # GRPO: held-out rewards at step 0 and step 2 (train.steps, eval_every), each the mean of its 4 prompts
    history = json.loads((out / "rl" / "history.json").read_text())
    evals = history["evals"]
    assert [e["step"] for e in evals] == [0, 2] and len(history["history"]) == 2
    for e in evals:
        per_prompt = e["heldout_reward_per_prompt"]
        assert len(per_prompt) == 4 and all(math.isfinite(x) for x in per_prompt)        # train.data.heldout_prompts
        assert e["eval/heldout_reward_mean"] == pytest.approx(sum(per_prompt) / 4)
        assert e["eval/heldout_reward_ci_low"] <= e["eval/heldout_reward_mean"] <= e["eval/heldout_reward_ci_high"]
    assert all(math.isfinite(h["reward/mean"]) for h in history["history"])
    first, last = evals[0]["eval/heldout_reward_mean"], evals[-1]["eval/heldout_reward_mean"]
    assert results["GRPO"] == f"held-out reward {first:+.3f} -> {last:+.3f}"


@pytest.mark.timeout(600)
def test_quickstart_recipe_without_rl_runs_no_rl_stage(tmp_path):
    recipe = tmp_path / "no_rl.yaml"
    recipe.write_text((ROOT / "recipes" / "quickstart.yaml").read_text().split("\npgenrm:")[0] + "\n")
    out = tmp_path / "qs"
    sets = [*SMALL_WORLD, "eval.max_pairs=4", "data.retrieval.embedder=bm25", "eval.modes=[pointwise]",
            "eval.inputs=[none]"]
    done = run_cli("quickstart", "--out", str(out), "--recipe", str(recipe), *[a for s in sets for a in ("--set", s)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "eval" / "report.md").is_file() and not (out / "rl").exists() and not (out / "rl_world").exists()
