"""The Best-of-N sweep on Ray: one pool of N samples per prompt from a rollout worker (vLLM, in its default
multiprocess runtime), scored once per reward model
and by the downstream judge through reward pools, curves for every k, the validity report; a rerun resumes (no
prompt generated or scored twice)."""
from __future__ import annotations

import json
import sys

from pr_rlhf.configs.base import engine_config
from pr_rlhf.configs.bon import BoNConfig
from pr_rlhf.configs.reward import reward_config
from pr_rlhf.configs.world import WorldConfig
from tests.optional import need
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)

ray = need("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORLD = WorldConfig(users=6, cold_start_users=2, history_size=2, val_pairs_per_user=0, test_pairs_per_user=2)


def test_sweep_pools_once_scores_once_and_resumes(ray_cluster, tmp_path):  # noqa: F811
    from data_pipelines.build import ensure_world_shards
    from workers.bon import BoNSweep

    shards = tmp_path / "data"
    ensure_world_shards(shards, WORLD)
    cfg = BoNConfig(policy=engine_config(backend="vllm", model="tiny", max_model_len=512), shards=str(shards),
                    prompts=3, n=4, max_tokens=12, prompts_per_call=2, out=str(tmp_path / "bon"),
                    reward_models={"gold": reward_config(kind="gold", world=WORLD),
                                   "prior": reward_config(kind="world_estimate", estimator="no_history", world=WORLD),
                                   "listed": reward_config(kind="gold", world=WORLD, normalize=True)},
                    benchmark_accuracy={"listed": 0.5},
                    downstream=reward_config(kind="gold", world=WORLD, normalize=True))
    report = BoNSweep(cfg, seed=0, log=lambda _m: None).run()
    pool = sorted((tmp_path / "bon" / "pool").glob("part-*.parquet"))
    assert len(pool) == 2                                        # 3 prompts, 2 per rollout call
    curve = {p["k"]: p for p in report["curves"]["gold"] if p["subset"] == "all"}
    assert sorted(curve) == [1, 2, 4] and all(c["prompts"] == 3 for c in curve.values())
    # the RM is the downstream judge itself (same order within a user): picking from more samples never hurts
    assert curve[1]["mean"] <= curve[2]["mean"] + 1e-12 <= curve[4]["mean"] + 2e-12
    assert report["counts"]["gold"] == {"prompts": 3, "downstream_unscored": 0, "rm_unscored": 0}
    assert set(report["validity"]) >= {"spearman_rho", "ndcg"} and "bon/gold/best_of_4" in report["metrics"]["gold"]
    # benchmark accuracies: the recipe's number, and the world's own for gold (true weights) and world_estimate
    bench = report["benchmark_accuracy"]
    assert bench["listed"] == 0.5 and 0.5 < bench["gold"] <= 1.0 and 0.0 <= bench["prior"] <= 1.0
    for name in ("bon.md", "bon_gold.png", "bon.png", "correlation.md", "correlation.png"):
        assert (tmp_path / "bon" / name).is_file(), name
    import pyarrow.parquet as pq

    row = pq.read_table(pool[0]).to_pylist()[0]   # what judges see travels with the pool
    assert json.loads(row["history"]) and json.loads(row["rubric"]) and row["narrative"]

    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "bon").rglob("part-*.parquet")}
    again = BoNSweep(cfg, seed=0, log=lambda _m: None).run()
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "bon").rglob("part-*.parquet")} == written
    assert json.dumps(again["curves"], sort_keys=True) == json.dumps(report["curves"], sort_keys=True)
