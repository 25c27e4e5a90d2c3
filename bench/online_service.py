"""Mixed feedback + scoring through the reward service with its user store, batched vs one at a time, loopback.

Workload: ``--users`` seen users of ``recipes/pgenrm_pipeline.yaml``'s world arrive with nothing stored; each sends
their first 3 train pairs as feedback, then 2 of their test pairs are scored with no history in the request (the
service reads the 3 stored pairs). The scorer is the shipped P-GenRM (``models/pgenrm_tiny``); the store is SQLite
(WAL), one file per deployment.

- **one at a time** (baseline): ``max_batch_size = 1``, one client, every feedback and every score its own
  request, user after user;
- **batched**: ``max_batch_size = 32``, ``--clients`` concurrent clients, each user's feedback in one
  ``/feedback_batch`` request and its scores in one ``/score_batch`` request.

Both must end with the same store (every feedback once) and the same verdict per pair (greedy decoding on the
same stored history): a lost write, a duplicate or a different verdict is counted and fails the run.

Last line (bench/common.py): ``BENCH online_service users=<U> ops=<N> batched_ops_s=<x> single_ops_s=<y>
lost=<l> duplicated=<d> wrong=<w> config=.. baseline=.. ours=.. ratio=<x/y>``. ``--quick``: 4 users.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common

FEEDBACK_PAIRS, SCORED_PAIRS = 3, 2


def workload(users: int) -> list[dict]:
    """Per user: its feedback bodies and its score items."""
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.world import build_world

    world = build_world(load_recipe(str(common.PGENRM_RECIPE)).pgenrm.world)
    ids = sorted(u.user_id for u in world.users if not u.cold_start)[:users]
    out = []
    for u in ids:
        feedback = [{"user_id": u, "query": h.question, "chosen": h.chosen, "rejected": h.rejected,
                     "idempotency_key": f"{u}-{i}"} for i, h in enumerate(world.history(u, FEEDBACK_PAIRS))]
        scores = [{"user_id": u, "query": p.question, "responses": [p.chosen, p.rejected]}
                  for p in world.pairs_of(u, "test")[:SCORED_PAIRS]]
        out.append({"user": u, "feedback": feedback, "scores": scores})
    return out


def one_at_a_time(url: str, work: list[dict]) -> tuple[float, dict]:
    import httpx

    verdicts = {}
    start = time.perf_counter()
    with httpx.Client(timeout=600) as http:
        for w in work:
            for body in w["feedback"]:
                assert http.post(url + "/feedback", json=body).status_code == 201
            for i, item in enumerate(w["scores"]):
                r = http.post(url + "/score", json=item)
                verdicts[(w["user"], i)] = tuple(r.json().get("scores") or ()) if r.status_code == 200 else None
    return time.perf_counter() - start, verdicts


def batched(url: str, work: list[dict], clients: int) -> tuple[float, dict]:
    import httpx

    http = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=clients))

    def user(w: dict) -> dict:
        r = http.post(url + "/feedback_batch", json={"items": w["feedback"]})
        assert r.status_code == 200, r.text
        r = http.post(url + "/score_batch", json={"items": w["scores"]})
        results = r.json()["results"] if r.status_code == 200 else [{}] * len(w["scores"])
        return {(w["user"], i): tuple(x.get("scores") or ()) or None for i, x in enumerate(results)}

    start = time.perf_counter()
    verdicts: dict = {}
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for part in pool.map(user, work):
            verdicts.update(part)
    http.close()
    return time.perf_counter() - start, verdicts


def measure(args: argparse.Namespace) -> common.Result:
    from ray import serve

    from pr_rlhf.configs.reward import reward_config
    from pr_rlhf.configs.serve import ServeConfig, UserStoreConfig
    from pr_rlhf.serve.users import UserStore, sqlite_url
    from workers.learner.ranks import free_port
    from workers.ray_utils import init_local_ray, shutdown_local_ray
    from workers.reward_service import deploy

    work = workload(args.users)
    ops = sum(len(w["feedback"]) + len(w["scores"]) for w in work)
    reward = reward_config(kind="genrm", judge={"model": str(common.SHIPPED_GENRM)}, sec_format="sec_compact",
                           generation={"max_tokens": 320})
    common.header(model=f"P-GenRM {common.genrm_label(common.SHIPPED_GENRM)}",
                  data=f"{len(work)} users x ({FEEDBACK_PAIRS} feedback + {SCORED_PAIRS} scores) = {ops} operations",
                  settings="loopback Serve, 1 replica of 2 CPUs per deployment, SQLite user store (WAL)")
    folder = Path(tempfile.mkdtemp(prefix="online_bench_"))
    stores = {name: sqlite_url(folder / f"{name}.sqlite") for name in ("single", "batched")}
    init_local_ray(num_cpus=4)
    port = free_port()
    try:
        base = deploy(ServeConfig(reward=reward, port=port, name="single", route_prefix="/single", num_cpus=2,
                                  max_batch_size=1, users=UserStoreConfig(url=stores["single"], embedder=None,
                                                                          profile_items=0)))
        deploy(ServeConfig(reward=reward, port=port, name="batched", route_prefix="/batched", num_cpus=2,
                           max_batch_size=32, users=UserStoreConfig(url=stores["batched"], embedder=None,
                                                                    profile_items=0)))
        root = base.rsplit("/", 1)[0]
        warm = [{"user": "warm-up", "feedback": [dict(work[0]["feedback"][0], user_id="warm-up",
                                                      idempotency_key="warm")], "scores": work[0]["scores"][:1]}]
        one_at_a_time(root + "/single", warm)
        one_at_a_time(root + "/batched", warm)
        single_s, single = one_at_a_time(root + "/single", work)
        batched_s, many = batched(root + "/batched", work, args.clients)
    finally:
        serve.shutdown()
        shutdown_local_ray()
    wrong = sum(single.get(k) != many.get(k) for k in single)
    lost = sum(v is None for v in [*single.values(), *many.values()])
    feedback = sum(len(w["feedback"]) for w in work)
    duplicated = 0
    for name in stores:
        users, rows = UserStore(stores[name]).count()
        lost += max(feedback + 1 - rows, 0)            # + the warm-up user's one feedback
        duplicated += max(rows - feedback - 1, 0)
    single_rate, batched_rate = ops / single_s, ops / batched_s
    print(f"{ops} operations ({feedback} feedback, {ops - feedback} scores) for {len(work)} users")
    print(f"  one at a time: {single_s:.1f} s ({single_rate:.2f} ops/s); batched: {batched_s:.1f} s "
          f"({batched_rate:.2f} ops/s); lost {lost}, duplicated {duplicated}, different verdicts {wrong}")
    return common.Result(
        "online_service", ratio=batched_rate / single_rate, exit_code=1 if (wrong or lost or duplicated) else 0,
        fields={"users": len(work), "ops": ops, "batched_ops_s": batched_rate, "single_ops_s": single_rate,
                "lost": lost, "duplicated": duplicated, "wrong": wrong},
        config=f"P-GenRM {common.genrm_label(common.SHIPPED_GENRM)}; {len(work)} arriving users x "
               f"({FEEDBACK_PAIRS} feedback + {SCORED_PAIRS} scores reading them); loopback Serve, SQLite store",
        baseline=f"one at a time (max_batch_size 1, 1 client, a request per operation): {single_rate:.2f} ops/s",
        ours=f"batched (max_batch_size 32, {args.clients} clients, /feedback_batch + /score_batch per user): "
             f"{batched_rate:.2f} ops/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="4 users")
    args = parser.parse_args()
    if args.quick:
        args.users = 4
    common.run("online_service", lambda: measure(args))


if __name__ == "__main__":
    main()
