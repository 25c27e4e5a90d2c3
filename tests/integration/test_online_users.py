"""Online personalization through the running reward service (Ray Serve on loopback, the user store on SQLite):
feedback -> GET /users -> scoring reads the stored history -> DELETE; bad feedback (4xx naming the field, nothing
stored); 32 clients mixing feedback and scoring with retries (nothing lost or duplicated); tenants scoped by their
tokens; a redeployed service keeps every user; feedback text never in the logs. The scorer echoes what it was
given (the history's chosen answers, the profile posts), so each test sees exactly what the store supplied."""
from __future__ import annotations

import concurrent.futures
import json
import random
import sys
import uuid
from pathlib import Path

import pytest

from pr_rlhf.configs.reward import reward_config
from pr_rlhf.configs.serve import ServeConfig, UserStoreConfig
from pr_rlhf.serve.users import UserStore, sqlite_url
from pr_rlhf.world import WorldConfig
from tests.local_nodes import free_port
from tests.optional import need
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)

ray = need("ray")
httpx = need("httpx")
serve = need("ray.serve")

WORLD = WorldConfig(users=2, cold_start_users=0, history_size=1, val_pairs_per_user=0, test_pairs_per_user=1)
TOKENS = {"acme": "tok-acme-3f9a", "globex": "tok-globex-77c1"}


def echo_factory(cfg):
    """A scorer whose score is the number of history pairs it saw and whose persona lists what it saw."""
    from pr_rlhf.scorers import Evaluation, GoldScorer

    class Echo(GoldScorer):
        def __init__(self, cfg):
            pass

        def evaluate(self, requests):
            return [Evaluation((float(len(r.meta["history"])),), persona=json.dumps(
                {"history": [h["chosen"] for h in r.meta["history"]], "posts": [p["text"] for p in r.meta["retrieved"]],
                 "stated": r.meta["stated_preferences"]})) for r in requests]

    return Echo(cfg)


class KillOnce:
    """Scorer factory: the echo scorer, in a replica that SIGKILLs itself in the middle of storing the first
    feedback whose key starts with 'kill-' (the feedback row written, its transaction not committed); a file in
    ``gate`` makes it once, so the client's retry of the same key goes through on the new replica."""

    def __init__(self, gate: Path):
        self.gate = str(gate)

    def __call__(self, cfg):
        import os
        import signal

        import sqlalchemy as sa

        gate = os.path.join(self.gate, "killed")

        def die(conn, cursor, statement, parameters, context, executemany):
            values = parameters.values() if isinstance(parameters, dict) else (parameters or ())
            if statement.lstrip().upper().startswith("INSERT INTO FEEDBACK") and any(
                    isinstance(v, str) and v.startswith("kill-") for v in values):
                try:
                    os.close(os.open(gate, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return
                os.kill(os.getpid(), signal.SIGKILL)

        sa.event.listen(sa.engine.Engine, "after_cursor_execute", die)
        return echo_factory(cfg)


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def service(ray_cluster, tmp_path_factory):  # noqa: F811
    """Two applications on one port: 'open' (no auth, 2 replicas sharing one SQLite file) and 'tenants' (a token
    per tenant, its own file)."""
    from workers.reward_service import RewardService, deploy

    folder = tmp_path_factory.mktemp("users")
    port = free_port()
    users = UserStoreConfig(url=sqlite_url(folder / "open.sqlite"), embedder=None, profile_items=2,
                            max_text_chars=2000)
    open_cfg = ServeConfig(reward=reward_config(kind="gold", world=WORLD), port=port, name="open",
                           route_prefix="/open", replicas=2, num_cpus=0.25, users=users)
    base = deploy(open_cfg, scorer_factory=echo_factory)
    tenants_cfg = ServeConfig(reward=reward_config(kind="gold", world=WORLD), port=port, name="tenants",
                              route_prefix="/tenants", num_cpus=0.25,
                              tenant_tokens_env={t: f"PR_RLHF_TEST_TOKEN_{t.upper()}" for t in TOKENS},
                              users=users.model_copy(update={"url": sqlite_url(folder / "tenants.sqlite")}))
    env = {f"PR_RLHF_TEST_TOKEN_{t.upper()}": tok for t, tok in TOKENS.items()}
    serve.run(RewardService.options(num_replicas=1, ray_actor_options={"num_cpus": 0.25,
                                                                       "runtime_env": {"env_vars": env}})
              .bind(tenants_cfg.model_dump(), echo_factory), name="tenants", route_prefix="/tenants")
    killable = ServeConfig(reward=reward_config(kind="gold", world=WORLD), port=port, name="killable",
                           route_prefix="/killable", num_cpus=0.25,
                           users=users.model_copy(update={"url": sqlite_url(folder / "killable.sqlite")}))
    deploy(killable, scorer_factory=KillOnce(folder))
    root = base.rsplit("/", 1)[0]
    yield {"open": root + "/open", "tenants": root + "/tenants", "killable": root + "/killable", "folder": folder,
           "open_cfg": open_cfg, "killable_cfg": killable}
    serve.shutdown()


def feedback(user: str, key: str, chosen: str = "short", **extra) -> dict:
    return {"user_id": user, "query": f"question {key}", "chosen": chosen, "rejected": "long", "idempotency_key": key,
            **extra}


def score(url: str, user: str, **extra) -> dict:
    r = httpx.post(url + "/score", json={"user_id": user, "query": "q", "responses": ["a", "b"], **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_feedback_then_scoring_reads_the_stored_history_then_delete(service):
    url = service["open"]
    for i in range(4):
        r = httpx.post(url + "/feedback", json=feedback("alice", f"alice-{i}", chosen=f"c{i}",
                                                       stated_preferences="terse" if i == 0 else ""), timeout=60)
        assert r.status_code == 201 and r.json()["seq"] == i + 1, r.text
    again = httpx.post(url + "/feedback", json=feedback("alice", "alice-3", chosen="c3"), timeout=60)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    user = httpx.get(url + "/users/alice", timeout=60).json()
    assert user["size"] == 4 and user["prototype"] is None and user["updated"].endswith("Z")
    result = score(url, "alice")
    seen = json.loads(result["persona"])
    assert seen["history"] == ["c1", "c2", "c3"] and result["score"] == 3.0     # the 3 most recent, oldest first
    assert seen["stated"] == "terse" and len(seen["posts"]) == 2
    assert result["user_state"]["pairs"] == [["alice", 2], ["alice", 3], ["alice", 4]]
    own = score(url, "alice", history=[{"chosen": "given", "rejected": "x"}])   # a request's own history wins
    assert json.loads(own["persona"])["history"] == ["given"]
    assert score(url, "nobody")["score"] == 0.0 and score(url, "nobody")["user_state"] is None
    gone = httpx.delete(url + "/users/alice", timeout=60)
    assert gone.status_code == 200 and gone.json() == {"user_id": "alice", "deleted": True, "feedback_removed": 4}
    assert httpx.get(url + "/users/alice", timeout=60).status_code == 404
    assert httpx.delete(url + "/users/alice", timeout=60).status_code == 404
    assert score(url, "alice")["score"] == 0.0


@pytest.mark.parametrize("body, field", [
    (b'{"query": "q", "chosen": "a", "rejected": "b", "idempotency_key": "k"}', "user_id"),
    (b'{"user_id": "bob", "query": "q", "chosen": 7, "rejected": "b", "idempotency_key": "k"}', "chosen"),
    (json.dumps(feedback("bob", "k", chosen="x" * 2001)).encode(), "chosen"),
    (json.dumps(feedback("bob", "k")).encode().replace(b'"long"', b'"lo\xff\xfeng"'), "rejected"),
    (json.dumps(feedback("bob", "k")).encode().replace(b'"short"', b'"\\ud800"'), "chosen"),
    (b'{"user_id": "bob", ', ""),
    (json.dumps(feedback("bob", "k", extra_field=1)).encode(), "extra_field"),
])
def test_bad_feedback_is_a_4xx_naming_the_field_and_stores_nothing(service, body, field):
    url, store = service["open"], UserStore(service["open_cfg"].users.url)
    before = store.count()
    r = httpx.post(url + "/feedback", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["field"] == field, r.text
    assert store.count() == before
    assert httpx.get(url + "/users/bob", timeout=60).status_code == 404
    missing = httpx.get(url + "/users/bob", timeout=60).json()["detail"]
    assert missing["field"] == "user_id"


def test_a_reused_key_with_other_content_is_a_conflict(service):
    url = service["open"]
    assert httpx.post(url + "/feedback", json=feedback("carol", "carol-1"), timeout=60).status_code == 201
    r = httpx.post(url + "/feedback", json=feedback("carol", "carol-1", chosen="changed"), timeout=60)
    assert r.status_code == 409 and r.json()["detail"]["field"] == "idempotency_key"
    assert httpx.get(url + "/users/carol", timeout=60).json()["size"] == 1


def test_32_clients_mixing_feedback_and_scoring_lose_and_duplicate_nothing(service):
    """32 clients, 16 users, 6 feedback each (a third of them sent twice, as a client retrying), each followed by
    a score of that user: every feedback stored once, in order per client, and each score saw only that user's
    stored pairs, never more than the 3 of the history size."""
    url = service["open"]
    run = uuid.uuid4().hex[:6]

    def client(c: int) -> list[float]:
        rng, scores = random.Random(c), []
        with httpx.Client(timeout=120) as http:
            for i in range(6):
                body = feedback(f"mix{c % 16}-{run}", f"{run}-{c}-{i}", chosen=f"{c}-{i}")
                for _ in range(2 if rng.random() < 0.33 else 1):
                    assert http.post(url + "/feedback", json=body).status_code in (200, 201)
                r = http.post(url + "/score", json={"user_id": body["user_id"], "query": "q", "response": "a"})
                assert r.status_code == 200, r.text
                seen = json.loads(r.json()["persona"])["history"]
                assert f"{c}-{i}" in seen and all(s.split("-")[0] in (str(c), str((c + 16) % 32)) for s in seen)
                scores.append(r.json()["score"])
        return scores

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        scores = [s for part in pool.map(client, range(32)) for s in part]
    assert max(scores) == 3.0
    store = UserStore(service["open_cfg"].users.url)
    for u in range(16):
        state = store.get_user("default", f"mix{u}-{run}", history=None)
        assert state.size == 12 and [h["seq"] for h in state.history] == list(range(1, 13))
        for c in (u, u + 16):   # each client's own order survives the interleaving
            mine = [h["chosen"] for h in state.history if h["chosen"].split("-")[0] == str(c)]
            assert mine == [f"{c}-{i}" for i in range(6)]


def test_tenants_are_scoped_by_their_tokens(service):
    url = service["tenants"]
    acme, globex = ({"Authorization": f"Bearer {TOKENS[t]}"} for t in ("acme", "globex"))
    assert httpx.post(url + "/feedback", json=feedback("dana", "d1"), timeout=60).status_code == 401
    assert httpx.post(url + "/feedback", json=feedback("dana", "d1"), headers={"Authorization": "Bearer no"},
                      timeout=60).status_code == 401
    assert httpx.post(url + "/feedback", json=feedback("dana", "d1", chosen="acme-secret"), headers=acme,
                      timeout=60).status_code == 201
    assert httpx.get(url + "/users/dana", headers=acme, timeout=60).json()["size"] == 1
    assert httpx.get(url + "/users/dana", headers=globex, timeout=60).status_code == 404
    assert httpx.delete(url + "/users/dana", headers=globex, timeout=60).status_code == 404
    r = httpx.post(url + "/score", json={"user_id": "dana", "query": "q", "response": "a"}, headers=globex, timeout=60)
    assert r.json()["score"] == 0.0 and "acme-secret" not in r.text       # globex's "dana" is nobody
    # the same key in another tenant is another feedback, not a conflict
    assert httpx.post(url + "/feedback", json=feedback("dana", "d1", chosen="globex"), headers=globex,
                      timeout=60).status_code == 201
    r = httpx.post(url + "/score", json={"user_id": "dana", "query": "q", "response": "a"}, headers=acme, timeout=60)
    assert json.loads(r.json()["persona"])["history"] == ["acme-secret"]


def test_a_redeployed_service_keeps_every_user_and_logs_no_feedback_text(service):
    from workers.reward_service import deploy

    url, marker = service["open"], f"secret-preference-{uuid.uuid4().hex}"
    assert httpx.post(url + "/feedback", json=feedback("erin", "erin-1", chosen=marker), timeout=60).status_code == 201
    bad = feedback("erin", "erin-2", chosen=marker + "x" * 2001)
    assert httpx.post(url + "/feedback", json=bad, timeout=60).status_code == 422
    assert httpx.post(url + "/feedback", json=feedback("erin", "erin-1", chosen=marker + "!"),
                      timeout=60).status_code == 409
    serve.delete("open")
    deploy(service["open_cfg"], scorer_factory=echo_factory)
    assert httpx.get(url + "/users/erin", timeout=60).json()["size"] == 1
    assert json.loads(score(url, "erin")["persona"])["history"] == [marker]
    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    leaked = [p for p in logs.rglob("*") if p.is_file() and p.stat().st_size < 50_000_000
              and marker.encode() in p.read_bytes()]
    assert not leaked, leaked


def test_a_replica_killed_mid_write_leaves_no_partial_record(service):
    """The replica dies (SIGKILL) between writing the feedback row and committing: the client sees a failure, Serve
    brings a replica back, the store holds nothing of that feedback, and the client's retry with the same key stores
    it once, as the user's next pair."""
    import time

    url, store = service["killable"], UserStore(service["killable_cfg"].users.url)
    for i in range(2):
        assert httpx.post(url + "/feedback", json=feedback("kim", f"kim-{i}"), timeout=60).status_code == 201
    body = feedback("kim", "kill-1", chosen="the one in flight")
    try:
        failed = httpx.post(url + "/feedback", json=body, timeout=60).status_code
    except httpx.HTTPError as exc:
        failed = type(exc).__name__
    assert failed != 201, failed
    assert store.count() == (1, 2) and store.get_user("default", "kim").size == 2   # nothing partial
    deadline = time.time() + 180
    while time.time() < deadline:   # Serve replaces the replica; the client retries the same key
        try:
            r = httpx.get(url + "/users/kim", timeout=10)
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    state = store.get_user("default", "kim", history=None)
    assert state.size == 2 and [h["seq"] for h in state.history] == [1, 2]
    assert (service["folder"] / "killed").exists()          # it was killed where the test meant
    retry = httpx.post(url + "/feedback", json=body, timeout=60)
    assert retry.status_code == 201 and retry.json()["seq"] == 3, retry.text
    assert store.get_user("default", "kim", history=None).history[-1]["chosen"] == "the one in flight"
