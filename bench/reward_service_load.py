"""Load and fault test of the reward service (`pr-rlhf serve-reward`), loopback only, bounded in count and time.

One local Ray + Serve on 127.0.0.1 (a free port). The scorer in each replica (``--scorer``):

- ``pgenrm`` (default): the shipped P-GenRM ``models/pgenrm_tiny`` (``--genrm`` points at another one), a
  generative RM writing one evaluation chain of ~220 tokens per pair, where batching pays. Data: test pairs of the
  seen users of ``recipes/pgenrm_pipeline.yaml``'s world, each with the user's first 3 train pairs as history;
- ``scalar``: the tiny scalar RM (one forward pass per request). Data: the responses of a 16-user default world.

Phases:

1. **one at a time** (the baseline): a deployment with ``max_batch_size = 1`` and one client sending the requests
   in sequence;
2. **batched**: ``max_batch_size = 32`` and ``--clients`` (32) concurrent clients sending the same requests;
3. **fault**: 2 replicas, the same concurrent load, one replica killed after ``--kill-after`` requests; clients
   retry what failed (up to 8 tries). Every returned score is compared with the baseline's score for the same
   input: a wrong score or a lost request is counted and makes the script exit non-zero.

What bounds each side is measured, not guessed: every response carries the time the replica spent on it (queue
for its batch + the scorer), so the rest of the client's latency is Serve's HTTP path (client, proxy, routing,
serialization). The one-at-a-time phase's medians of both are printed and reported (``model_ms``, ``http_ms``),
and the batched phase's mean batch size (from each replica's ``/info``). Where the HTTP path is most of a
request's time, merging requests into one scorer call has little to save.

Prints throughput, p50 / p99 latency and errors per phase; the LAST line is machine-readable (``bench/common.py``):

    BENCH reward_service_load scorer=<> clients=<C> requests=<R> batched_rps=<x> single_rps=<y> p50_ms=<..>
          p99_ms=<..> model_ms=<..> http_ms=<..> mean_batch=<..> errors=<e> wrong=<w> lost=<l> [fault=failed:..]
          config=.. baseline=.. ours=.. ratio=<x/y>

Run: ``.venv/bin/python bench/reward_service_load.py`` (a few minutes on 2 cores), ``--scorer scalar``, or
``--quick``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common
from workers.learner.ranks import free_port

HISTORY_PAIRS = 3


@dataclass
class Load:
    """One phase's outcome: a score per item (None: lost), latencies of the successful sends, failed sends."""

    scores: list[float | None]
    wall_s: float
    latency_ms: list[float] = field(default_factory=list)     # client side, per successful send
    replica_ms: list[float] = field(default_factory=list)     # the replica's own time for the same sends
    errors: int = 0

    def rps(self) -> float:
        return len(self.scores) / self.wall_s


def run_load(url: str, items: list[dict], clients: int, retries: int = 0, on_sent=None) -> Load:
    import httpx

    load = Load(scores=[], wall_s=0.0)
    lock = threading.Lock()
    http = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=clients))

    def send(index: int) -> float | None:
        for attempt in range(retries + 1):
            start = time.perf_counter()
            try:
                r = http.post(url, json=items[index])
                body = r.json() if r.status_code == 200 else {}
                if body.get("score") is not None:
                    with lock:
                        load.latency_ms.append(1000 * (time.perf_counter() - start))
                        load.replica_ms.append(float(body.get("latency_ms") or 0.0))
                    if on_sent is not None:
                        on_sent()
                    return float(body["score"])
            except (httpx.HTTPError, ValueError):
                pass
            with lock:
                load.errors += 1
            time.sleep(0.2 * (attempt + 1))
        return None

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        load.scores = list(pool.map(send, range(len(items))))
    load.wall_s = time.perf_counter() - start
    http.close()
    return load


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def mismatches(scores: list[float | None], reference: list[float | None]) -> int:
    return sum(s is not None and r is not None and abs(s - r) > 1e-4 for s, r in zip(scores, reference))


def workload(args: argparse.Namespace):
    """(reward config, items, what scores them, what data they are)."""
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.configs.reward import reward_config
    from pr_rlhf.world import WorldConfig, build_world

    if args.scorer == "pgenrm":
        world = build_world(load_recipe(str(common.PGENRM_RECIPE)).pgenrm.world)
        reward = reward_config(kind="genrm", judge={"model": str(Path(args.genrm).resolve())},
                               sec_format="sec_compact", generation={"max_tokens": 320})
        items = [{"user_id": p.user_id, "query": p.question, "responses": [p.chosen, p.rejected],
                  "history": [{"question": h.question, "chosen": h.chosen, "rejected": h.rejected}
                              for h in world.history(p.user_id, HISTORY_PAIRS)]}
                 for p in world.pairs if p.split == "test"][:args.requests]
        return (reward, items, f"P-GenRM {common.genrm_label(args.genrm)}, a pair per request",
                f"test pairs of {common.PGENRM_RECIPE.relative_to(common.ROOT)}'s world, {HISTORY_PAIRS} history "
                "pairs each")
    world = build_world(WorldConfig(users=16, cold_start_users=0))
    texts = [(p.user_id, p.question, t) for p in world.pairs for t in (p.chosen, p.rejected)]
    items = [{"user_id": u, "query": q, "response": t} for u, q, t in (texts * 8)[:args.requests]]
    return reward_config(kind="scalar"), items, "the tiny scalar RM, a response per request", \
        "responses of a 16-user default world"


def served_batches(url: str) -> tuple[int, int]:
    """(batches, items) the (one-replica) deployment behind ``url`` has scored so far."""
    import httpx

    info = httpx.get(url, timeout=10).json()
    return info["batches"], info["items"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scorer", choices=["pgenrm", "scalar"], default="pgenrm")
    parser.add_argument("--genrm", default=str(common.SHIPPED_GENRM),
                        help="the P-GenRM model directory (default: the shipped models/pgenrm_tiny)")
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--kill-after", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=600.0,
                        help="seconds for the whole run (the fault phase is skipped past it)")
    parser.add_argument("--quick", action="store_true", help="8 requests, 8 clients, a replica killed after 4, "
                                                              "each deployment warmed up with 1 request (not 4)")
    args = parser.parse_args(argv)
    args.warmup = 4   # requests sent one at a time to each deployment before it is measured
    if args.quick:    # (one is what warms it: its first call; a P-GenRM request takes seconds on 2 cores)
        args.requests, args.clients, args.kill_after, args.warmup = 8, 8, 4, 1
    return args


def measure(args: argparse.Namespace) -> common.Result:
    from ray import serve

    from pr_rlhf.configs.serve import ServeConfig
    from workers.ray_utils import init_local_ray, shutdown_local_ray
    from workers.reward_service import deploy

    deadline = time.time() + args.time_limit
    reward, items, scorer, data = workload(args)
    common.header(model=scorer, data=f"{len(items)} requests from {data}",
                  settings=f"loopback, 2 CPUs per replica, batched phase {args.clients} clients and max_batch_size "
                           "32; fault phase 2 replicas")
    fields: dict[str, object] = {"scorer": args.scorer, "clients": args.clients, "requests": len(items)}
    phases: dict[str, Load] = {}
    init_local_ray(num_cpus=8)   # logical CPUs: the two idle deployments stay up through the fault phase
    port = free_port()
    try:
        base = deploy(ServeConfig(reward=reward, port=port, name="single", route_prefix="/single", num_cpus=2,
                                  max_batch_size=1))
        deploy(ServeConfig(reward=reward, port=port, name="batched", route_prefix="/batched", num_cpus=2,
                           max_batch_size=32, batch_wait_timeout_s=0.01))
        root = base.rsplit("/", 1)[0]
        run_load(root + "/single/score", items[:args.warmup], 1)          # warm-up both
        run_load(root + "/batched/score", items[:args.warmup], 1)
        warm = served_batches(root + "/batched/info")
        single = phases["one at a time"] = run_load(root + "/single/score", items, 1)
        batched = phases[f"batched ({args.clients} clients)"] = run_load(root + "/batched/score", items, args.clients)
        done = served_batches(root + "/batched/info")
        mean_batch = (done[1] - warm[1]) / max(done[0] - warm[0], 1)
        wrong = mismatches(batched.scores, single.scores)
        lost = sum(s is None for s in single.scores + batched.scores)
        if time.time() > deadline:
            fields["fault"] = f"skipped:time limit {args.time_limit:.0f} s reached"
        else:
            faulted = common.optional_part(fields, "fault", lambda: fault_phase(args, reward, port, root, items))
            if faulted is not None:
                phases["batched, a replica killed"] = faulted
                wrong += mismatches(faulted.scores, single.scores)
                lost += sum(s is None for s in faulted.scores)
    finally:
        serve.shutdown()
        shutdown_local_ray()

    print(f"{len(items)} requests, {scorer}, loopback; replicas: 1 (2 in the fault phase)")
    for name, load in phases.items():
        print(f"  {name:28s} {load.rps():7.1f} req/s  p50 {percentile(load.latency_ms, 50):7.1f} ms  "
              f"p99 {percentile(load.latency_ms, 99):7.1f} ms  failed sends {load.errors}")
    model_ms = statistics.median(single.replica_ms) if single.replica_ms else float("nan")
    client_ms = statistics.median(single.latency_ms) if single.latency_ms else float("nan")
    http_ms = client_ms - model_ms
    print(f"  one at a time, per request (medians): {client_ms:.1f} ms at the client = {model_ms:.1f} ms in the "
          f"replica's scorer + {http_ms:.1f} ms in Serve's HTTP path ({http_ms / client_ms:.0%})")
    print(f"  batched: {mean_batch:.1f} requests per scorer call on average")
    print(f"  wrong scores {wrong}, requests lost {lost} (all phases)")
    ratio = batched.rps() / single.rps()
    fields.update({"batched_rps": batched.rps(), "single_rps": single.rps(),
                   "p50_ms": percentile(batched.latency_ms, 50), "p99_ms": percentile(batched.latency_ms, 99),
                   "model_ms": model_ms, "http_ms": http_ms, "http_share": http_ms / client_ms,
                   "mean_batch": mean_batch, "errors": batched.errors, "wrong": wrong, "lost": lost})
    return common.Result(
        "reward_service_load", ratio=ratio, fields=fields, exit_code=1 if (wrong or lost) else 0,
        config=f"{scorer}; {len(items)} requests ({data}); loopback Serve, 2 CPUs per replica; one request: "
               f"{model_ms:.0f} ms scorer + {http_ms:.0f} ms HTTP path",
        baseline=f"one at a time (max_batch_size 1, 1 client): {single.rps():.1f} req/s",
        ours=f"batched (max_batch_size 32, {args.clients} clients, {mean_batch:.1f} per call): "
             f"{batched.rps():.1f} req/s")


def fault_phase(args: argparse.Namespace, reward, port: int, root: str, items: list[dict]) -> Load:
    """2 replicas under the concurrent load, one of them killed after ``--kill-after`` successful sends."""
    import ray

    from pr_rlhf.configs.serve import ServeConfig
    from workers.reward_service import deploy

    deploy(ServeConfig(reward=reward, port=port, name="fault", route_prefix="/fault", num_cpus=2, replicas=2,
                       max_batch_size=32))
    run_load(root + "/fault/score", items[:args.warmup], 1)
    sent = {"n": 0, "killed": False}
    lock = threading.Lock()

    def kill_one():
        with lock:
            sent["n"] += 1
            if sent["n"] < args.kill_after or sent["killed"]:
                return
            sent["killed"] = True
        names = [a for a in ray.util.list_named_actors(all_namespaces=True)
                 if "SERVE_REPLICA" in a["name"] and "fault" in a["name"]]
        ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)

    return run_load(root + "/fault/score", items, args.clients, retries=7, on_sent=kill_one)


def main() -> None:
    args = parse_args()
    common.run("reward_service_load", lambda: measure(args))


if __name__ == "__main__":
    main()
