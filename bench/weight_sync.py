"""Benchmark of the weight sync learner -> rollout engine: the bucketed gloo transfer through vLLM's
weight-transfer protocol (ours, ``LearnerGroup.push_weights``) vs the earlier path, which only this benchmark still
runs (rank 0's full state dict through the driver and Ray's object store, ``ray.put`` +
``RolloutWorker.load_weights``), on the same learner and engine, in one run.

Setup: a Qwen2 of Qwen2.5-0.5B's shape (random init, float32, built from its config: 494M parameters; ``--quick``:
a ~25M one), a 2-rank FSDP2 learner (gloo) and one HF rollout engine, all on a private local Ray. After one
warm-up sync per path (the group forms on the first), ``--syncs`` timed syncs per path, alternating. Measured:
seconds per sync, and the peak host memory above the idle level summed over this process tree (the driver, the
raylet, the object store's shared memory and every actor: ``pr_rlhf.peak_memory.PeakRSS``), per path. Both paths
leave the engine with the same weights (tests/integration/test_weight_sync.py).

    BENCH weight_sync s_per_sync_broadcast=.. s_per_sync_object_store=.. peak_extra_gb_broadcast=..
          peak_extra_gb_object_store=.. params=.. config=.. baseline=.. ours=.. ratio=<object_store s / broadcast s>

Run: ``.venv/bin/python bench/weight_sync.py`` (~5 min and ~10 GB on 2 cores) or ``--quick``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from common import Result, fmt, header, run

# vocab_size is replaced by the tiny builder's own 3,072-token tokenizer: Qwen2.5-0.5B's layers, not its embedding
QWEN05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
           "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
           "max_position_embeddings": 2048}
SMALL = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 2,
         "intermediate_size": 1024, "vocab_size": 32000, "tie_word_embeddings": True}


def measure(args: argparse.Namespace) -> Result:
    import ray

    from pr_rlhf.configs.recipe import engine_config
    from pr_rlhf.models.sources import resolve_model
    from pr_rlhf.peak_memory import PeakRSS
    from workers.learner import LearnerGroup
    from workers.ray_utils import init_local_ray, shutdown_local_ray
    from workers.rollout import spawn_rollout_worker

    shape = SMALL if args.quick else QWEN05B
    model = resolve_model("tiny:" + json.dumps(shape, sort_keys=True))
    header(benchmark="weight sync learner -> rollout engine", model=f"Qwen2 {shape} (random init, float32)",
           learner="2 ranks, FSDP2 over gloo", engine="1 HF rollout worker", syncs=args.syncs)
    init_local_ray(num_cpus=2)
    try:
        rollout = spawn_rollout_worker(engine_config(backend="hf", model=model, dtype="float32",
                                                     max_model_len=256), num_cpus=0.5)
        learner = LearnerGroup({"model": model, "world_size": 2, "strategy": "fsdp2", "device": "cpu",
                                "num_cpus_per_worker": 0.5})
        ray.get(rollout.ready.remote())
        params = learner.describe()[0]["local_trained_params"]   # a DTensor counts its global elements
        seconds: dict[str, list[float]] = {"broadcast": [], "object_store": []}
        peaks: dict[str, float] = {}
        version = 0
        def sync(path: str, version: int) -> None:
            if path == "broadcast":
                learner.push_weights([rollout], version)
            else:   # the baseline: the whole state dict through this driver and the object store
                ray.get(rollout.load_weights.remote(ray.put(learner.state_dict_for_rollout()), version))

        for path in seconds:   # warm-up: the group forms, the object store maps its memory
            version += 1
            sync(path, version)
        for _ in range(args.syncs):
            for path in seconds:
                idle = PeakRSS(interval_s=0.02)
                base = idle.sample()
                with PeakRSS(interval_s=0.02) as peak:
                    t0 = time.perf_counter()
                    version += 1
                    sync(path, version)
                    seconds[path].append(time.perf_counter() - t0)
                peaks[path] = max(peaks.get(path, 0.0), (peak.peak_bytes - base) / 2**30)
                print(f"{path}: {seconds[path][-1]:.2f} s, peak +{(peak.peak_bytes - base) / 2**30:.2f} GB",
                      flush=True)
        learner.shutdown()
    finally:
        shutdown_local_ray()
    ours, base = statistics.median(seconds["broadcast"]), statistics.median(seconds["object_store"])
    # the tiny builder keeps the layer shapes and swaps in its own small vocabulary (see the README row)
    layers = "Qwen2.5-0.5B layers" if not args.quick else "small Qwen2 layers"
    return Result("weight_sync", config=f"{layers}, 3k-token vocab: {params / 1e6:.0f}M params fp32, 2 FSDP2 "
                                        "ranks -> 1 HF engine",
                  baseline=f"object store: {base:.2f} s, +{peaks['object_store']:.2f} GB",
                  ours=f"broadcast: {ours:.2f} s, +{peaks['broadcast']:.2f} GB", ratio=base / ours,
                  fields={"s_per_sync_broadcast": fmt(ours), "s_per_sync_object_store": fmt(base),
                          "peak_extra_gb_broadcast": fmt(peaks["broadcast"]),
                          "peak_extra_gb_object_store": fmt(peaks["object_store"]), "params": params})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~25M model, 1 timed sync per path")
    parser.add_argument("--syncs", type=int, default=None, help="timed syncs per path (default 3; --quick 1)")
    args = parser.parse_args()
    args.syncs = args.syncs or (1 if args.quick else 3)
    run("weight_sync", lambda: measure(args))


if __name__ == "__main__":
    main()
