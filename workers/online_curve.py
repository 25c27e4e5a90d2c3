"""The online learning curve (docs/results/online/PREREGISTRATION.md): users arrive with nothing stored, send their
train pairs as feedback through the running reward service, and after each step their held-out pairs are scored
through it; the same model scores the same inputs offline beside it.

Driver only: the world and the pairs come from :mod:`pr_rlhf.world`, the store and its use from
:mod:`pr_rlhf.serve`, the statistics from :mod:`pr_rlhf.serve.curve`.
"""
from __future__ import annotations

import concurrent.futures
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pr_rlhf.configs.reward import reward_config
from pr_rlhf.configs.serve import ServeConfig, UserStoreConfig
from pr_rlhf.serve.curve import BORROW, OFFLINE, REFERENCE, SERVICE
from pr_rlhf.serve.users import sqlite_url
from workers.learner.ranks import free_port

HISTORY_PAIRS = 3
SEED = 0


@dataclass
class CurveSettings:
    recipe: str                      # its pgenrm.world is the world
    genrm: str                       # the served model's folder
    out: Path                        # run folder (stores, prototypes, outcomes)
    points: tuple[int, ...] = (0, 1, 2, 4, 8)
    borrow_points: tuple[int, ...] = (1, 2)
    users: int | None = None         # the first N seen users (None: all)
    clients: int = 32
    prototypes_k: int = 3


def _pool_map(fn, items: list, clients: int, desc: str) -> list:
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        return list(tqdm(pool.map(fn, items), total=len(items), desc=desc, leave=False, mininterval=5))


def run_curve(s: CurveSettings) -> dict[str, Any]:
    """Runs every arm; returns {"outcomes": [...], "settings": {...}, "wall_s": ...}."""
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.models import make_engine
    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.reward.inputs import RMInput
    from pr_rlhf.reward.judge import PairwiseJudge
    from pr_rlhf.world import build_world

    start = time.time()
    world = build_world(load_recipe(s.recipe).pgenrm.world)
    # the seen users: a cold-start user of the world has one train pair, too few for the curve's 8
    users = sorted(u.user_id for u in world.users if not u.cold_start)[:s.users]
    stream = {u: world.history(u) for u in users}
    tests = [p for p in world.pairs if p.split == "test" and p.user_id in set(users)]
    s.out.mkdir(parents=True, exist_ok=True)
    # a run that stopped resumes: the service phase's verdicts and each finished offline arm are saved as they end
    key = {"points": list(s.points), "borrow_points": list(s.borrow_points), "users": users, "genrm": s.genrm}
    saved_service, saved_offline = s.out / "service_outcomes.json", s.out / "offline_outcomes.json"
    resumed = json.loads(saved_service.read_text()) if saved_service.is_file() else None
    if resumed is not None and resumed["key"] != key:
        resumed = None
    earlier_s = resumed["wall_s"] if resumed else 0.0
    reward = reward_config(kind="genrm", judge={"model": str(Path(s.genrm).resolve())}, sec_format="sec_compact",
                           generation={"max_tokens": 320}, seed=SEED)
    if resumed is None:
        outcomes = _service_phase(s, users, stream, tests, reward)
        _write_json(saved_service, {"key": key, "wall_s": time.time() - start, "outcomes": outcomes})
        saved_offline.unlink(missing_ok=True)
    else:
        outcomes = resumed["outcomes"]
    offline_done = json.loads(saved_offline.read_text()) if saved_offline.is_file() else []
    outcomes += offline_done
    done_arms = {(o["arm"], o["k"]) for o in offline_done}

    # the offline twin: the same model in this process, the pairs the service says it used
    engine = make_engine(reward.judge)
    judge = PairwiseJudge(engine, params=SamplingParams(temperature=0.0, max_tokens=320), seed=SEED,
                          fmt="sec_compact")
    used = {(o["k"], o["pair_id"]): o["pairs"] for o in outcomes if o["arm"] == SERVICE}
    # a stored pair's seq is its arrival order; its idempotency key ("<user>-<index>") names the world's pair
    from pr_rlhf.serve.users import UserStore, sqlite_url

    store = UserStore(sqlite_url(s.out / "own.sqlite"))
    stored_as = {(r["user_id"], r["seq"]): int(r["idempotency_key"].rsplit("-", 1)[1])
                 for r in store.export_jsonl("default")}
    store.close()
    triples = {(u, seq): {"question": stream[u][i].question, "chosen": stream[u][i].chosen,
                          "rejected": stream[u][i].rejected} for (u, seq), i in stored_as.items()}

    def inputs(history_of) -> list:
        return [RMInput(p.pair_id, p.user_id, "", p.question, p.chosen, p.rejected, history=history_of(p))
                for p in tests]

    arms = [(OFFLINE, k, lambda p, k=k: [triples[tuple(x)] for x in used[(k, p.pair_id)]]) for k in s.points]
    first = {u: [{"question": h.question, "chosen": h.chosen, "rejected": h.rejected}
                 for h in stream[u][:HISTORY_PAIRS]] for u in users}
    arms.append((REFERENCE, None, lambda p: first[p.user_id]))
    for arm, k, history_of in tqdm([a for a in arms if (a[0], a[1]) not in done_arms], desc="offline"):
        rows = [{"arm": arm, "k": k, "pair_id": p.pair_id, "user_id": p.user_id, "chosen_slot": v.chosen_slot,
                 "predicted": v.predicted, "correct": v.correct, "error": v.error}
                for p, v in zip(tests, judge.judge(inputs(history_of), "none", 10))]
        outcomes += rows
        offline_done += rows
        _write_json(saved_offline, offline_done)
    engine.close()
    return {"outcomes": outcomes, "wall_s": earlier_s + time.time() - start,
            "settings": {"recipe": s.recipe, "genrm": s.genrm, "points": list(s.points),
                         "borrow_points": list(s.borrow_points), "users": len(users), "test_pairs": len(tests),
                         "history_pairs": HISTORY_PAIRS, "selection": "recent", "prototypes_k": s.prototypes_k,
                         "neighbours": 2, "seed": SEED, "clients": s.clients}}


def _write_json(path: Path, value: Any) -> None:
    from pr_rlhf.files import atomic_write_text

    atomic_write_text(path, json.dumps(value))


def _service_phase(s: CurveSettings, users: list[str], stream: dict, tests: list, reward: Any) -> list[dict]:
    """Users send their pairs as feedback through the running service; after each point their test pairs are
    scored through it (and through the borrowing service at its points)."""
    from ray import serve

    from pr_rlhf.models.embedders import make_embedder
    from pr_rlhf.reward.judge import chosen_slot
    from pr_rlhf.serve.client import ServiceClient
    from pr_rlhf.serve.personalize import build_feedback_prototypes
    from workers.ray_utils import init_local_ray, shutdown_local_ray
    from workers.reward_service import deploy

    for old in s.out.glob("*.sqlite*"):
        old.unlink()
    protos = s.out / "prototypes"
    if s.borrow_points:
        build_feedback_prototypes({u: [(h.chosen, h.rejected) for h in stream[u]] for u in users},
                                  make_embedder("minilm", cache=False), s.prototypes_k, seed=SEED).save(protos)
    outcomes: list[dict] = []
    init_local_ray(num_cpus=4)
    port = free_port()
    try:
        own_cfg = ServeConfig(reward=reward, port=port, name="own", route_prefix="/own", num_cpus=2,
                              users=UserStoreConfig(url=sqlite_url(s.out / "own.sqlite"), embedder=None,
                                                    history_pairs=HISTORY_PAIRS, profile_items=0))
        base = deploy(own_cfg)
        root = base.rsplit("/", 1)[0]
        apps = {SERVICE: root + "/own"}
        if s.borrow_points:
            deploy(ServeConfig(reward=reward, port=port, name="borrow", route_prefix="/borrow", num_cpus=2,
                               users=UserStoreConfig(url=sqlite_url(s.out / "borrow.sqlite"), embedder="minilm",
                                                     prototypes=str(protos), neighbours=2,
                                                     history_pairs=HISTORY_PAIRS, profile_items=0)))
            apps[BORROW] = root + "/borrow"
        clients = {app: ServiceClient(url, timeout_s=600, seed=SEED) for app, url in apps.items()}

        def send_feedback(job: tuple[str, str, range]) -> None:
            app, user, indices = job
            for i in indices:   # one user's pairs in order (users in parallel), as one person sends them
                h = stream[user][i]
                clients[app].post("/feedback", {"user_id": user, "query": h.question, "chosen": h.chosen,
                                                "rejected": h.rejected, "idempotency_key": f"{user}-{i}"})

        def score(job: tuple[str, Any]) -> dict:
            app, p = job
            slot = chosen_slot(SEED, p.pair_id)
            pair = [p.chosen, p.rejected] if slot == "A" else [p.rejected, p.chosen]
            body = clients[app].post("/score", {"user_id": p.user_id, "query": p.question, "responses": pair})
            scores = body.get("scores")
            predicted = None if not scores or scores[0] == scores[1] else ("A" if scores[0] > scores[1] else "B")
            return {"pair_id": p.pair_id, "user_id": p.user_id, "chosen_slot": slot, "predicted": predicted,
                    "correct": predicted == slot, "error": None if scores else body.get("status"),
                    "pairs": (body.get("user_state") or {}).get("pairs", [])}

        stored = 0
        for k in s.points:
            targets = [SERVICE] + ([BORROW] if k <= max(s.borrow_points, default=-1) else [])
            jobs = [(app, u, range(stored, k)) for app in targets for u in users]
            _pool_map(send_feedback, jobs, s.clients, f"feedback to {k}")
            stored = k
            for app in [SERVICE] + ([BORROW] if k in s.borrow_points else []):
                for row in _pool_map(score, [(app, p) for p in tests], s.clients, f"{app} k={k}"):
                    outcomes.append({"arm": app, "k": k, **row})
        for client in clients.values():
            client.close()
    finally:
        serve.shutdown()
        shutdown_local_ray()

    return outcomes


def write_results(result: dict[str, Any], folder: Path) -> dict[str, Any]:
    """outcomes.json (every verdict with its user id), summary.json, summary.md, curve.png."""
    from pr_rlhf.files import atomic_write_text
    from pr_rlhf.serve.curve import markdown, plot, summarize

    folder.mkdir(parents=True, exist_ok=True)
    settings = result["settings"]
    summary = summarize(result["outcomes"], settings["points"], settings["borrow_points"])
    summary["settings"], summary["wall_s"] = settings, round(result["wall_s"], 1)
    atomic_write_text(folder / "outcomes.json", json.dumps({"settings": settings, "outcomes": result["outcomes"]}))
    atomic_write_text(folder / "summary.json", json.dumps(summary, indent=1))
    atomic_write_text(folder / "summary.md", markdown(summary))
    plot(summary, str(folder / "curve.png"))
    return summary
