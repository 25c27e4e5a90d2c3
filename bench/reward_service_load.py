"""Load and fault test of the reward service (`pr-rlhf serve-reward`), loopback only, bounded in count and time.

One local Ray + Serve on 127.0.0.1 (a free port). The scorer in each replica: the trained tiny P-GenRM when its
checkpoint is there (a generative RM: an evaluation chain of ~220 tokens per pair, where batching pays), else
the tiny scalar RM (one forward pass per request: on 2 cores the HTTP path, not the model, bounds it). Phases:

1. **one at a time** (the baseline): a deployment with ``max_batch_size = 1`` and one client sending the requests
   in sequence;
2. **batched**: ``max_batch_size = 32`` and ``--clients`` (32) concurrent clients sending the same requests;
3. **fault**: 2 replicas, the same concurrent load, one replica killed after ``--kill-after`` requests; clients
   retry what failed (up to 8 tries). Every returned score is compared with the baseline's score for the same
   input: a wrong score or a lost request is counted and makes the script exit non-zero.

Prints throughput, p50 / p99 latency and errors per phase; the LAST line is machine-readable:

    BENCH reward_service_load clients=32 requests=<R> batched_rps=<x> single_rps=<y> p50_ms=<..> p99_ms=<..>
          errors=<e> wrong=<w> ratio=<x/y>

Run: ``.venv/bin/python bench/reward_service_load.py`` (a few minutes on 2 cores) or ``--quick``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_load(url: str, items: list[dict], clients: int, retries: int = 0,
             on_sent=None) -> tuple[list[float | None], list[float], int, float]:
    """(score per item, latency per success in ms, failed sends, wall seconds)."""
    import httpx

    errors = 0
    latencies: list[float] = []
    http = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=clients))

    def send(index: int) -> float | None:
        nonlocal errors
        for attempt in range(retries + 1):
            start = time.perf_counter()
            try:
                r = http.post(url, json=items[index])
                if r.status_code == 200 and r.json()["score"] is not None:
                    latencies.append(1000 * (time.perf_counter() - start))
                    if on_sent is not None:
                        on_sent()
                    return float(r.json()["score"])
            except httpx.HTTPError:
                pass
            errors += 1
            time.sleep(0.2 * (attempt + 1))
        return None

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        scores = list(pool.map(send, range(len(items))))
    wall = time.perf_counter() - start
    http.close()
    return scores, latencies, errors, wall


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--kill-after", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds for the whole run")
    parser.add_argument("--genrm", default="runs/pgenrm/curriculum/model",
                        help="a trained tiny P-GenRM (from `pr-rlhf pgenrm recipes/pgenrm_pipeline.yaml`); absent: "
                             "the tiny scalar RM")
    parser.add_argument("--quick", action="store_true", help="32 requests, 16 clients")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.clients, args.kill_after = 32, 16, 8
    deadline = time.time() + args.time_limit

    import ray
    from ray import serve

    from pr_rlhf.configs.reward import reward_config
    from pr_rlhf.configs.serve import ServeConfig
    from pr_rlhf.world import WorldConfig, build_world
    from workers.ray_utils import init_local_ray, shutdown_local_ray
    from workers.reward_service import deploy

    if Path(args.genrm).is_dir():
        # the P-GenRM pipeline's world: pairs of seen users with their first 3 history pairs as evidence
        world = build_world(WorldConfig(rendering="compact", n_attributes=3, n_archetypes=3, users=200,
                                        max_differing_attributes=2, cold_start_users=40, reference_samples=4000))
        reward = reward_config(kind="genrm", judge={"model": args.genrm}, sec_format="sec_compact",
                               generation={"max_tokens": 320})
        scorer = f"the trained tiny P-GenRM ({args.genrm}), a pair per request"
        items = [{"user_id": p.user_id, "query": p.question, "responses": [p.chosen, p.rejected],
                  "history": [{"question": h.question, "chosen": h.chosen, "rejected": h.rejected}
                              for h in world.history(p.user_id, 3)]}
                 for p in world.pairs if p.split == "test"][:args.requests]
    else:
        world = build_world(WorldConfig(users=16, cold_start_users=0))
        reward = reward_config(kind="scalar")
        scorer = "the tiny scalar RM (no trained GenRM found)"
        texts = [(p.user_id, p.question, t) for p in world.pairs for t in (p.chosen, p.rejected)]
        items = [{"user_id": u, "query": q, "response": t} for u, q, t in (texts * 8)[:args.requests]]
    init_local_ray(num_cpus=4)
    port = free_port()
    phases = {}
    try:
        base = deploy(ServeConfig(reward=reward, port=port, name="single", route_prefix="/single", num_cpus=2,
                                  max_batch_size=1))
        deploy(ServeConfig(reward=reward, port=port, name="batched", route_prefix="/batched", num_cpus=2,
                           max_batch_size=32, batch_wait_timeout_s=0.01))
        root = base.rsplit("/", 1)[0]
        run_load(root + "/single/score", items[:4], 1)          # warm-up both
        run_load(root + "/batched/score", items[:4], 1)
        reference, lat, err, wall = run_load(root + "/single/score", items, 1)
        phases["one at a time"] = (lat, err, wall)
        if time.time() > deadline:
            raise TimeoutError("time limit reached after the baseline")
        scores, lat, err, wall = run_load(root + "/batched/score", items, args.clients)
        phases[f"batched ({args.clients} clients)"] = (lat, err, wall)
        wrong = sum(s is None or r is None or abs(s - r) > 1e-4 for s, r in zip(scores, reference))
        serve.delete("single")
        serve.delete("batched")

        deploy(ServeConfig(reward=reward, port=port, name="fault", route_prefix="/fault", num_cpus=2, replicas=2,
                           max_batch_size=32))
        run_load(root + "/fault/score", items[:4], 1)
        sent = {"n": 0, "killed": False}

        def kill_one():
            sent["n"] += 1
            if sent["n"] >= args.kill_after and not sent["killed"]:
                sent["killed"] = True
                names = [a for a in ray.util.list_named_actors(all_namespaces=True)
                         if "SERVE_REPLICA" in a["name"] and "fault" in a["name"]]
                ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)

        faulted, lat, err, wall = run_load(root + "/fault/score", items, args.clients, retries=7, on_sent=kill_one)
        phases["batched, a replica killed"] = (lat, err, wall)
        lost = sum(s is None for s in faulted)
        wrong_fault = sum(s is not None and r is not None and abs(s - r) > 1e-4 for s, r in zip(faulted, reference))
    finally:
        serve.shutdown()
        shutdown_local_ray()

    print(f"{len(items)} requests, {scorer}, loopback; replicas: 1 (2 in the fault phase)")
    for name, (lat, err, wall) in phases.items():
        print(f"  {name:28s} {len(items) / wall:7.1f} req/s  p50 {percentile(lat, 50):7.1f} ms  "
              f"p99 {percentile(lat, 99):7.1f} ms  failed sends {err}")
    print(f"  wrong scores: batched {wrong}, fault phase {wrong_fault}; requests lost in the fault phase: {lost}")
    single = phases["one at a time"]
    batched = phases[f"batched ({args.clients} clients)"]
    single_rps, batched_rps = len(items) / single[2], len(items) / batched[2]
    print(f"BENCH reward_service_load clients={args.clients} requests={len(items)} batched_rps={batched_rps:.1f} "
          f"single_rps={single_rps:.1f} p50_ms={percentile(batched[0], 50):.1f} "
          f"p99_ms={percentile(batched[0], 99):.1f} errors={batched[1]} wrong={wrong + wrong_fault} "
          f"lost={lost} ratio={batched_rps / single_rps:.2f}")
    return 1 if (wrong or wrong_fault or lost) else 0


if __name__ == "__main__":
    sys.exit(main())
