"""The reward service on Ray Serve (the test session's loopback cluster): routes and their schema errors, pairs,
OpenRLHF's remote-RM shape, verl's reward function through verl's own reward manager, batching of concurrent
requests, a model backend that fails (5xx, no hang), and a replica killed under load (replaced; no wrong or lost
score). The `pr-rlhf serve-reward` command itself, with bearer-token auth, runs as a subprocess at the end."""
from __future__ import annotations

import concurrent.futures
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pr_rlhf.configs.base import engine_config
from pr_rlhf.configs.reward import reward_config
from pr_rlhf.configs.serve import ServeConfig
from pr_rlhf.world import WorldConfig, build_world
from tests.cli_subprocess import kill_session
from tests.local_nodes import free_port
from tests.optional import need
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)

ray = need("ray")
httpx = need("httpx")
serve = need("ray.serve")

ROOT = Path(__file__).resolve().parents[2]
WORLD = WorldConfig(users=6, cold_start_users=0, history_size=2, val_pairs_per_user=0, test_pairs_per_user=2)


HOLD = "#hold"     # a query ending so is held by the gold replicas' scorer (see HoldOnce)
HOLD_WAIT_S = 120   # generous: the machine is shared; nothing asserts on time


class HoldOnce:
    """Scorer factory of the gold application: the world's gold scorer, except that the first batch holding a
    request whose query ends with ``#hold`` (the first of all replicas: a file in ``gate`` claims it) writes the
    replica's actor name to ``gate/held`` and waits until ``gate/release`` exists. Its retries score at once."""

    def __init__(self, gate: Path):
        self.gate = str(gate)

    def __call__(self, cfg):
        from pr_rlhf.scorers import GoldScorer

        gate = self.gate

        class HeldGold(GoldScorer):
            def evaluate(self, requests):
                if any(r.question.endswith(HOLD) for r in requests):
                    try:
                        claim = os.open(os.path.join(gate, "claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                    except FileExistsError:
                        claim = None
                    if claim is not None:
                        os.close(claim)
                        name = ray.get_runtime_context().get_actor_name()
                        Path(gate, "held.tmp").write_text(f"{name}\n{os.getpid()}\n")
                        os.replace(os.path.join(gate, "held.tmp"), os.path.join(gate, "held"))
                        deadline = time.monotonic() + HOLD_WAIT_S
                        while not os.path.exists(os.path.join(gate, "release")) and time.monotonic() < deadline:
                            time.sleep(0.02)
                return super().evaluate(requests)

        return HeldGold(cfg)


# HoldOnce travels to the replicas by value (this module is not importable there).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def service(ray_cluster, tmp_path_factory):  # noqa: F811
    """Serve on a free loopback port with three applications: gold (2 replicas, its scorer able to hold a request:
    HoldOnce), a tiny scalar RM (batched), and a GenRM whose HTTP engine points at a closed port."""
    from workers.reward_service import deploy

    port = free_port()
    gate = tmp_path_factory.mktemp("hold")
    gold = ServeConfig(reward=reward_config(kind="gold", world=WORLD), port=port, name="gold", route_prefix="/gold",
                       replicas=2, num_cpus=0.25)
    base = deploy(gold, scorer_factory=HoldOnce(gate))
    deploy(ServeConfig(reward=reward_config(kind="scalar"), port=port, name="scalar", route_prefix="/scalar",
                       num_cpus=0.25, max_batch_size=16, batch_wait_timeout_s=0.05))
    dead = engine_config(backend="openai", model="judge", base_url=f"http://127.0.0.1:{free_port()}/v1",
                         max_retries=0, timeout_s=2.0)
    deploy(ServeConfig(reward=reward_config(kind="http", genrm_mode="pointwise", judge=dead), port=port, name="dead",
                       route_prefix="/dead", num_cpus=0.25, request_timeout_s=30))
    root = base.rsplit("/", 1)[0]
    yield {"root": root, "world": build_world(WORLD), "gate": gate}
    serve.shutdown()


def post(url: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(url, json=body, timeout=60, **kw)


def test_score_pairs_batches_and_schema_errors(service):
    world, url = service["world"], service["root"] + "/gold"
    pair = world.pairs[0]
    r = post(url + "/score", {"user_id": pair.user_id, "query": pair.question, "response": pair.chosen})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["score"] == pytest.approx(world.gold_utility(pair.chosen, pair.user_id)) and body["status"] == "ok"
    assert body["latency_ms"] > 0 and body["replica"]
    both = post(url + "/score", {"user_id": pair.user_id, "query": pair.question,
                                 "responses": [pair.chosen, pair.rejected]}).json()
    assert both["scores"] == pytest.approx([world.gold_utility(t, pair.user_id) for t in (pair.chosen, pair.rejected)])
    many = post(url + "/score_batch", {"items": [{"user_id": p.user_id, "query": p.question, "response": p.chosen}
                                                 for p in world.pairs[:3]]}).json()["results"]
    assert [m["score"] for m in many] == pytest.approx([world.gold_utility(p.chosen, p.user_id)
                                                        for p in world.pairs[:3]])
    unknown = post(url + "/score", {"user_id": "nobody", "query": "Q?", "response": "A."}).json()
    assert unknown["score"] is None and unknown["status"] == "unknown_user"     # a named failure, not a 0
    # malformed requests: 422 naming the field
    for bad, field in (({"query": "Q?", "response": "A."}, "user_id"),
                       ({"user_id": "u", "query": "Q?", "responses": ["a", "b", "c"]}, "responses"),
                       ({"user_id": "u", "query": "Q?", "response": "A.", "profile": [{"txt": "x"}]}, "profile"),
                       ({"user_id": "u", "query": "Q?"}, "exactly one of 'response'")):
        r = post(url + "/score", bad)
        assert r.status_code == 422 and field in r.text, (bad, r.text)
    assert httpx.post(url + "/score", content=b"{not json", timeout=30,
                      headers={"content-type": "application/json"}).status_code == 422


def test_openrlhf_remote_rm_shape(service):
    world, url = service["world"], service["root"] + "/gold/get_reward"
    pairs = world.pairs[:4]
    prompts = [f"<|user|>{p.question}<|assistant|>" for p in pairs]
    body = {"query": [pr + p.chosen for pr, p in zip(prompts, pairs)], "prompts": prompts,
            "labels": [p.user_id if i % 2 else f'{{"user_id": "{p.user_id}"}}' for i, p in enumerate(pairs)]}
    r = post(url, body)     # exactly what OpenRLHF's remote_rm_fn posts
    assert r.status_code == 200, r.text
    assert r.json()["rewards"] == pytest.approx([world.gold_utility(p.chosen, p.user_id) for p in pairs])
    assert post(url, {"query": body["query"]}).status_code == 422                      # no labels: whose reward?
    assert post(url, {**body, "labels": body["labels"][:2]}).status_code == 422       # misaligned
    unknown = post(url, {**body, "labels": ["nobody"] * 4})
    assert unknown.status_code == 502 and "unknown_user" in unknown.text             # never a silent 0


def test_verl_reward_function_through_verl_reward_manager(service, monkeypatch):
    """verl's NaiveRewardManager decodes a batch and calls our compute_score per response, as in training."""
    verl_naive = need("verl.workers.reward_manager.naive")
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from verl import DataProto

    from pr_rlhf.integrations.verl import compute_score
    from pr_rlhf.models.sources import resolve_model

    world = service["world"]
    monkeypatch.setenv("PR_RLHF_REWARD_URL", service["root"] + "/gold")
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    pairs = world.pairs[:3]
    prompt_ids = [tok(p.question)["input_ids"][-8:] for p in pairs]
    resp_ids = [tok(p.chosen)["input_ids"][:48] for p in pairs]
    width_p, width_r = max(map(len, prompt_ids)), max(map(len, resp_ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    prompts = torch.tensor([[pad] * (width_p - len(x)) + x for x in prompt_ids])
    responses = torch.tensor([x + [pad] * (width_r - len(x)) for x in resp_ids])
    mask = torch.tensor([[0] * (width_p - len(a)) + [1] * len(a) + [1] * len(b) + [0] * (width_r - len(b))
                         for a, b in zip(prompt_ids, resp_ids)])
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
        non_tensors={"data_source": np.array(["pr_rlhf"] * 3, dtype=object),
                     "reward_model": np.array([{"ground_truth": p.question} for p in pairs], dtype=object),
                     "extra_info": np.array([{"user_id": p.user_id, "query": p.question} for p in pairs],
                                            dtype=object)})
    manager = verl_naive.NaiveRewardManager(tokenizer=tok, num_examine=0, compute_score=compute_score)
    out = manager(data, return_dict=True)
    decoded = [tok.decode(x, skip_special_tokens=True) for x in resp_ids]
    want = [world.gold_utility(t, p.user_id) for t, p in zip(decoded, pairs)]
    got = out["reward_tensor"].sum(dim=1).tolist()
    assert got == pytest.approx(want, abs=1e-5) and out["reward_extra_info"]["reward_status"] == ["ok"] * 3
    # no user: refused naming the row's fields (tests/unit/test_verl_integration.py), not a silent neutral score
    with pytest.raises(ValueError, match="user_id"):
        compute_score("pr_rlhf", "text", "Q?", {})
    monkeypatch.setenv("PR_RLHF_REWARD_RETRIES", "1")
    gone = compute_score("pr_rlhf", "t", "Q?", {"user_id": "u", "reward_url": f"http://127.0.0.1:{free_port()}"})
    assert gone["reward_status"].startswith("gave_up after 2 tries")


def test_concurrent_requests_are_batched(service):
    url, world = service["root"] + "/scalar", service["world"]
    items = [{"user_id": p.user_id, "query": p.question, "response": p.chosen} for p in world.pairs[:8]] * 4
    alone = [post(url + "/score", it).json()["score"] for it in items[:8]]
    before = httpx.get(url + "/info", timeout=30).json()
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda it: post(url + "/score", it).json(), items))
    after = httpx.get(url + "/info", timeout=30).json()
    assert after["items"] - before["items"] == 32
    assert after["batches"] - before["batches"] < 32 / 2          # merged: far fewer scorer calls than requests
    assert [r["score"] for r in results] == pytest.approx(alone * 4, abs=1e-4)   # batching never changes a score


def test_model_backend_failure_is_a_clear_5xx(service):
    start = time.monotonic()
    r = post(service["root"] + "/dead/score", {"user_id": "u", "query": "Q?", "response": "A."})
    assert r.status_code == 502 and "engine failed" in r.text
    assert time.monotonic() - start < 30                               # bounded, never a hang


def test_killed_replica_is_replaced_and_no_score_is_wrong_or_lost(service):
    """A replica killed while it holds a request (HoldOnce: the test kills the replica that holds it, then lets it
    go): that request and whatever else the replica held fail at the client, which retries them; every score is
    still the gold utility, none lost, and Serve brings the replica back."""
    world, url, gate = service["world"], service["root"] + "/gold/score", service["gate"]
    items = [(p.user_id, p.question, text) for p in world.pairs for text in (p.chosen, p.rejected)][:60]
    held = 6
    failures: list[tuple[int, str]] = []      # (item, what failed) per failed try, as the client saw it

    def send(index: int) -> float:
        user, question, text = items[index]
        query = question + HOLD if index == held else question
        for attempt in range(8):      # the client retries what failed; a result is never guessed
            try:
                r = httpx.post(url, json={"user_id": user, "query": query, "response": text}, timeout=30)
                if r.status_code == 200:
                    return r.json()["score"]
                failures.append((index, f"HTTP {r.status_code}"))
            except httpx.HTTPError as exc:
                failures.append((index, type(exc).__name__))
            time.sleep(0.25 * (attempt + 1))
        raise AssertionError(f"request for {user} never succeeded")

    replicas = {a["name"]: a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)
                if "SERVE_REPLICA" in a["name"] and "gold" in a["name"]}
    assert len(replicas) == 2
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(send, i) for i in range(len(items))]
        try:
            deadline = time.monotonic() + HOLD_WAIT_S
            while not (gate / "held").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert (gate / "held").exists(), "the held request never reached a replica"
            name = (gate / "held").read_text().split()[0]
            assert name in replicas, (name, replicas)
            assert not futures[held].done()                   # in flight, held by that replica's scorer
            ray.kill(ray.get_actor(name, namespace=replicas[name]), no_restart=True)
        finally:
            (gate / "release").touch()                        # a replica that was not killed lets it go
        scores = [f.result() for f in futures]
    assert scores == [world.gold_utility(t, u) for u, _, t in items]     # exactly: JSON carries a float's repr
    # the held request died with its replica: its first try failed at the client and a retry scored it
    assert held in {i for i, _ in failures}, failures
    deadline = time.time() + 120
    while time.time() < deadline:       # Serve brings the application back to 2 running replicas
        status = serve.status().applications["gold"].deployments["RewardService"]
        if status.replica_states.get("RUNNING", 0) == 2 and status.status == "HEALTHY":
            break
        time.sleep(1)
    assert status.replica_states.get("RUNNING", 0) == 2, status


def test_planner_runs_once_per_distinct_prompt_in_a_batch():
    from pr_rlhf.models.base import Generation, Sample
    from pr_rlhf.scorers import GenRMScorer, RewardRequest

    class Stub:
        name = "stub"

        def __init__(self):
            self.prompts = []

        def generate(self, prompts, params):
            self.prompts += prompts
            return [Generation(samples=[Sample(text="1. lists\n2. examples" if "Aspects this user expects"
                                               in p[-1]["content"] else "Score: 7")]) for p in prompts]

    judge = engine_config(backend="hf", model="tiny")
    engine = Stub()
    scorer = GenRMScorer(reward_config(kind="genrm", genrm_mode="pointwise", judge=judge, planner=judge,
                                       input_mode="plan"), engine=engine)
    meta = {"retrieved": [{"id": "p1", "text": "I love lists."}]}
    reqs = [RewardRequest(str(i), "u", "How?", f"answer {i}", meta) for i in range(4)]
    reqs.append(RewardRequest("given", "u", "How?", "x", {**meta, "plan": ["brevity"]}))
    evaluations = scorer.evaluate(reqs)
    assert scorer.plans_computed == 1 and [e.scores for e in evaluations] == [(7.0,)] * 5
    assert evaluations[0].plan == ["lists", "examples"] and evaluations[-1].plan == ["brevity"]
    assert len(engine.prompts) == 1 + 5                                 # one planner call, five judge calls


def _takes_sigint(pid: int, tid: int) -> bool:
    """Whether thread `tid` of `pid` leaves SIGINT unblocked (a thread that blocks it would keep it pending)."""
    try:
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    except OSError:
        return False
    blocked = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    return not blocked & (1 << (signal.SIGINT - 1))


def _sigint_to_a_non_main_thread(pid: int) -> None:
    """SIGINT to one thread of `pid` other than its main thread (tgkill), else to the process. The oldest thread
    that takes SIGINT: Ray starts it at init and keeps it (a signal sent to a thread is lost if the thread ends)."""
    try:
        threads = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    except OSError:
        threads = []
    takers = [t for t in threads if _takes_sigint(pid, t)]
    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if not takers or tgkill is None or tgkill(pid, takers[0], signal.SIGINT) != 0:
        os.kill(pid, signal.SIGINT)


@pytest.mark.timeout(600)
def test_serve_reward_command_with_bearer_token(tmp_path):
    """`pr-rlhf serve-reward` as the README runs it (its own local Ray), with auth from the environment."""
    token = "tok-5e1f-never-logged"
    port = free_port()
    recipe = tmp_path / "serve.yaml"
    recipe.write_text(f"name: serve_test\nserve:\n  reward: {{kind: gold, world: {WORLD.model_dump_json()}}}\n"
                      f"  port: {port}\n  num_cpus: 0.5\n  auth_token_env: PR_RLHF_TEST_SERVE_TOKEN\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"PR_RLHF_TEST_SERVE_TOKEN": token, "RAY_AUTH_MODE": "disabled",
                "RAY_TMPDIR": str(tmp_path / "ray")})
    # started with SIGINT ignored, as from a background job (`make test &`, some CI runners): the command must
    # still stop on Ctrl-C (it failed this way when the suite itself ran as a background job)
    cli = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
           "os.execv(sys.executable, [sys.executable, '-m', 'pr_rlhf.cli', *sys.argv[1:]])",
           "serve-reward", str(recipe)]
    # a pipe, not a file: Ray's processes share the command's stdout and a file's offset let them overwrite it
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            start_new_session=True, text=True, errors="replace")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            assert proc.poll() is None, "".join(lines)[-3000:]
            if "reward service (" in "".join(lines):     # the command's ready line: deployed and serving
                break
            time.sleep(1)
        assert httpx.get(base + "/health", timeout=10).status_code == 200
        world = build_world(WORLD)
        p = world.pairs[0]
        item = {"user_id": p.user_id, "query": p.question, "response": p.chosen}
        assert post(base + "/score", item).status_code == 401
        assert post(base + "/score", item, headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = post(base + "/score", item, headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and ok.json()["score"] == pytest.approx(world.gold_utility(p.chosen, p.user_id))
    finally:
        # Ctrl-C to the command alone (signalling its whole group would also stop its Ray processes, whose death
        # may end the driver before it prints its goodbye), handed to one of Ray's threads in it: the kernel may
        # do that with a process's signal, and the command must still stop at once
        if proc.poll() is None:
            _sigint_to_a_non_main_thread(proc.pid)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass
        kill_session(proc.pid)      # whatever of its session is left
        proc.wait(timeout=30)
    reader.join(timeout=30)
    text = "".join(lines)
    assert "reward service (gold" in text, text[-2000:]
    assert "stopping the reward service" in text, text[-2000:]
    assert token not in text
    ray_logs = " ".join(p.read_text(errors="ignore") for p in (tmp_path / "ray").rglob("*.log")
                        if p.is_file() and p.stat().st_size < 5_000_000)
    assert token not in ray_logs
