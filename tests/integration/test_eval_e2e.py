"""`pr-rlhf eval` end to end with the tiny model: every (mode, inputs) cell on synthetic shards, and on shards
built from fixtures in the real PRB and PersonalRewardBench schemas; outputs and the mlflow run are checked."""
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_pipelines.build import build_shards
from pr_rlhf.configs.recipe import data_config, load_recipe
from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.eval.runner import EvalError, run_eval
from tests.fixtures_raw import PAIR_SCHEMA, pair_row, prb_row, write_parquet, write_prb

ROOT = Path(__file__).resolve().parents[2]
FAST = ["eval.generation.max_tokens=8", "eval.n_bootstrap=50", "eval.judge.max_model_len=2048",
        "eval.scalar_rm.max_length=512"]


@pytest.fixture(scope="module")
def synthetic_shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("world") / "shards"
    world = WorldConfig(users=12, cold_start_users=2, reference_samples=300)
    data = data_config(source="synthetic", out=str(out))
    data.retrieval.embedder = "bm25"
    build_shards(data, world)
    return out


def _recipe(shards: Path, out: Path, *extra: str):
    return load_recipe(ROOT / "recipes/eval_synthetic.yaml",
                       [f"eval.shards={shards}", f"eval.out={out}", "eval.max_pairs=6", *FAST, *extra])


def test_every_mode_on_synthetic_shards(synthetic_shards, tmp_path):
    recipe = _recipe(synthetic_shards, tmp_path / "run")
    result = run_eval(recipe)
    groups = set(result.report.summaries)
    assert groups == {f"{m}/{i}" for m in ("pointwise", "pairwise") for i in ("none", "profile", "plan")}
    for summary in result.report.summaries.values():
        assert summary["n"] == 6
        # honest accounting: every verdict is correct, a tie, or a counted failure, and only correct ones score
        assert summary["n_correct"] + summary["ties"] + summary["failures"] <= summary["n"]
        assert summary["accuracy"] == pytest.approx(summary["n_correct"] / summary["n"])
    preds = pq.read_table(result.report.predictions).to_pylist()
    assert len(preds) == 36 and {p["inputs"] for p in preds} == {"none", "profile", "plan"}
    metrics = json.loads(result.report.metrics.read_text())
    assert "world oracle" in json.dumps(metrics["references"])
    assert "| pairwise | plan |" in result.report.markdown.read_text()
    assert result.report.figure.read_bytes()[:4] == b"\x89PNG"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("eval_synthetic").experiment_id])
    assert run.data.metrics["eval/pointwise/none/accuracy"] == pytest.approx(
        result.report.summaries["pointwise/none"]["accuracy"])
    assert run.data.params["eval.max_pairs"] == "6"


def test_sec_format_both_orders_with_history(synthetic_shards, tmp_path, monkeypatch):
    """Each pair judged in both orders, and both prompts the engine receives hold the user's three history
    triples (query, chosen, rejected) and the pair's answers in the two slot orders."""
    import pr_rlhf.models as models
    from pr_rlhf.eval.runner import load_eval_inputs
    from pr_rlhf.reward.judge import chosen_slot, other

    received: list[str] = []
    make_engine = models.make_engine

    def recording_engine(cfg):   # the real engine; its generate() also records the prompts it is given
        engine = make_engine(cfg)
        generate = engine.generate

        def record(prompts, params):
            received.extend("\n".join(m["content"] for m in p) for p in prompts)
            return generate(prompts, params)
        engine.generate = record
        return engine
    monkeypatch.setattr(models, "make_engine", recording_engine)

    recipe = _recipe(synthetic_shards, tmp_path / "sec", "eval.modes=[pairwise]", "eval.inputs=[none]",
                     "eval.pairwise_format=sec", "eval.both_orders=true", "eval.generation.temperature=1.0")
    summary = run_eval(recipe).report.summaries["pairwise/none"]
    assert summary["n"] == 12 and summary["n_pairs"] == 6 and summary["both_orders"]
    assert summary["failures"] > 0  # a random model does not write evaluation chains; counted, never raised

    inputs = load_eval_inputs(recipe.eval, recipe.seed)   # the judged pairs, in the judge's order
    assert len(inputs) == 6 and len(received) == 12       # one prompt per pair and order, seeded order first
    for i, inp in enumerate(inputs):
        assert len(inp.history) == 3 and len({t["question"] for t in inp.history}) == 3
        first = chosen_slot(recipe.seed, inp.pair_id)
        for prompt, slot in zip(received[2 * i:2 * i + 2], (first, other(first))):
            for t in inp.history:
                assert f"User: {t['question']}\nChosen: {t['chosen']}\nRejected: {t['rejected']}" in prompt
            one, two = (inp.chosen, inp.rejected) if slot == "A" else (inp.rejected, inp.chosen)
            assert f"[Response 1]\n{one}\n[End of Response 1]" in prompt
            assert f"[Response 2]\n{two}\n[End of Response 2]" in prompt


def test_real_schema_fixtures(tmp_path):
    raw = write_prb(tmp_path / "prb", {"Art_and_Entertainment": [prb_row(f"a{i}") for i in range(4)],
                                       "Society_and_Culture": [prb_row(f"s{i}", category="books") for i in range(3)]})
    prb_shards = tmp_path / "prb_shards"
    build_shards(data_config(source="prb", input=str(raw), out=str(prb_shards),
                            retrieval={"embedder": "bm25", "top_k": 3}))
    recipe = _recipe(prb_shards, tmp_path / "prb_run", "eval.max_pairs=10")
    result = run_eval(recipe)
    assert result.n_pairs == 7
    assert set(result.report.summaries["pairwise/profile"]["subsets"]) == {"Art_and_Entertainment",
                                                                          "Society_and_Culture"}

    rows = [pair_row(f"c{u}{k}", f"u{u}", split) for u in range(3)
            for k, split in enumerate(["train", "train", "train", "test", "test"])]
    write_parquet(tmp_path / "prism" / "prism.parquet", rows, PAIR_SCHEMA)
    prism_shards = tmp_path / "prism_shards"
    build_shards(data_config(source="personal_rewardbench", input=str(tmp_path / "prism"), out=str(prism_shards),
                            options={"variant": "prism"}))
    recipe = _recipe(prism_shards, tmp_path / "prism_run", "eval.inputs=[none]", "eval.pairwise_format=sec")
    assert run_eval(recipe).n_pairs == 6


def test_cli_eval_and_clear_errors(synthetic_shards, tmp_path):
    cmd = [sys.executable, "-m", "pr_rlhf.cli", "eval", str(ROOT / "recipes/eval_synthetic.yaml"),
           "--out", str(tmp_path / "cli"), "--set", f"eval.shards={synthetic_shards}", "--set", "eval.max_pairs=3",
           "--set", "eval.inputs=[none]", "--set", "eval.modes=[pointwise]"]
    for item in FAST:
        cmd += ["--set", item]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "pointwise/none" in res.stdout and (tmp_path / "cli" / "metrics.json").exists()
    bad = subprocess.run(cmd[:5] + ["--set", f"eval.shards={tmp_path / 'nowhere'}"], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and "nowhere" in bad.stderr and "manifest" in bad.stderr
    with pytest.raises(EvalError, match=r"no val pairs in subsets \['nope'\]"):
        run_eval(_recipe(synthetic_shards, tmp_path / "x", "eval.split=val", "eval.subsets=[nope]"))


def test_users_filter_and_joined_splits_select_the_right_pairs(synthetic_shards, tmp_path):
    from pr_rlhf.eval.runner import load_eval_inputs
    from pr_rlhf.world.generator import build_world

    world = build_world(WorldConfig(users=12, cold_start_users=2, reference_samples=300))
    cold = {u.user_id for u in world.users if u.cold_start}

    def pairs(split: str, users: str) -> set:
        cfg = _recipe(synthetic_shards, tmp_path, f"eval.split={split}", f"eval.users={users}",
                      "eval.max_pairs=null").eval
        return {inp.pair_id for inp in load_eval_inputs(cfg, 0)}

    want = {(p.pair_id, p.user_id in cold) for p in world.pairs if p.split in ("val", "test")}
    assert pairs("val+test", "seen") == {pid for pid, is_cold in want if not is_cold}
    assert pairs("test", "cold_start") == {p.pair_id for p in world.pairs if p.split == "test" and p.user_id in cold}
    assert pairs("val+test", "all") == {pid for pid, _ in want}
    with pytest.raises(EvalError, match="no val pairs in subsets None from cold_start users"):
        load_eval_inputs(_recipe(synthetic_shards, tmp_path, "eval.split=val", "eval.users=cold_start").eval, 0)
