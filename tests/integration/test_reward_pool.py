"""Reward workers and the reward pool on Ray: gold rewards equal the world's gold utility, routing is sticky by
user, in-flight batches are bounded, a worker killed mid-batch costs no sample and scores none twice, and
requests that keep failing end with an error that is counted. Also the scorers in-process (gold normalization,
the generative RM's SEC / pointwise paths, the scalar RM) and the config's validation."""
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from pr_rlhf.configs.recipe import GenerationConfig, engine_config
from pr_rlhf.configs.reward import RewardConfig, reward_config
from pr_rlhf.models.base import Generation, Sample
from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore, format_sec
from pr_rlhf.scorers import GenRMScorer, GoldScorer, RewardRequest, ScalarScorer
from pr_rlhf.world import WorldConfig, build_world
from tests.optional import need
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.reward import RewardPool, sticky_index

ray = need("ray")
# The test scorers below travel to the workers by value (this module is not importable there).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORLD = WorldConfig(users=6, cold_start_users=0, history_size=2, val_pairs_per_user=0, test_pairs_per_user=2)
WAIT_S = 300  # generous: the machine is shared; nothing asserts on time
HOLD_ALONE_S = 10.0   # the held request scored with the first batch still unscored: it won the worker's lock


@pytest.fixture(scope="module")
def world():
    return build_world(WORLD)


def requests_of(world, limit=None):
    reqs = [RewardRequest(f"{p.pair_id}/{side}", p.user_id, p.question, text)
            for p in world.pairs for side, text in (("c", p.chosen), ("r", p.rejected))]
    return reqs[:limit]


def gold_cfg(**pool) -> RewardConfig:
    return reward_config(kind="gold", world=WORLD, pool={"workers": 2, "num_cpus": 0.25, "batch_size": 4, **pool})


# ---------------------------------------------------------------------------------------------------------------
# Test scorers (shipped to the workers by value)
# ---------------------------------------------------------------------------------------------------------------

class LoggedGold:
    """Gold scorer that appends one line per scored request to a log that outlives the worker process, sleeps
    ``delay_s`` per request, and reacts to special request ids: ``hold`` sleeps (until killed) the first time it is
    scored, ``poison`` kills its worker process, ``raise`` raises."""

    def __init__(self, log_path, delay_s=0.0):
        self.log_path, self.delay_s = str(log_path), delay_s

    def __call__(self, cfg):
        self.inner = GoldScorer(cfg)
        return self

    def seen(self, request_id):
        return request_id in invocation_log(self.log_path)

    def score(self, requests):
        out = []
        for req in requests:
            tag = req.request_id.rsplit("#", 1)[-1]
            first = not self.seen(req.request_id)
            with open(self.log_path, "a") as log:  # one short line per write: appends do not interleave
                log.write(f"{req.request_id}\t{os.getpid()}\n")
            if tag == "poison":
                os._exit(1)
            if tag == "raise":
                raise ValueError("scorer refuses this request")
            if tag == "hold" and first:
                time.sleep(WAIT_S)  # the test kills this worker meanwhile
            time.sleep(self.delay_s)
            out.extend(self.inner.score([req]))
        return out


def invocation_log(path):
    """request id -> pids of the processes that scored it, in order (complete lines only: workers append to it
    while the test reads)."""
    pids = defaultdict(list)
    if Path(path).exists():
        for line in Path(path).read_text().split("\n")[:-1]:
            request_id, pid = line.split("\t")
            pids[request_id].append(int(pid))
    return pids


# ---------------------------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------------------------

def test_gold_rewards_equal_world_gold_utility_and_routing_is_sticky(ray_cluster, world):  # noqa: F811
    reqs = requests_of(world)
    reqs.append(RewardRequest("stranger/c", "no-such-user", "q", "text"))
    with RewardPool(gold_cfg()) as pool:
        results = pool.score(reqs)
        assert [r.request_id for r in results] == [r.request_id for r in reqs]
        for req, res in zip(reqs[:-1], results):
            assert res.error is None and res.attempt == 1
            assert res.score == world.gold_utility(req.response, req.user_id)
            assert res.worker_id == f"reward-{pool.worker_index(req.user_id)}.1"
        assert results[-1].score is None and results[-1].error.startswith("unknown_user")
        assert pool.stats["failures"] == 1 and pool.stats["error_kinds"] == {"unknown_user": 1}
        assert pool.stats["retries"] == pool.stats["restarts"] == 0

        stats = pool.worker_stats()
        users = [set(s["users"]) for s in stats]
        assert all(users), "both workers should get users (6 users, sticky hash)"
        for index, seen in enumerate(users):
            assert all(pool.worker_index(u) == index for u in seen)
        assert not users[0] & users[1]
        counts = Counter()
        for s in stats:
            counts.update(s["invocations"])
        assert counts == Counter({r.request_id: 1 for r in reqs})
        # Stable across calls and independent of the process's hash seed.
        again = pool.score(reqs[:6])
        assert [r.worker_id for r in again] == [r.worker_id for r in results[:6]]
        assert all(pool.worker_index(r.user_id) == sticky_index(r.user_id, 2) for r in reqs)


def test_inflight_batches_are_bounded(ray_cluster, world, tmp_path):  # noqa: F811
    reqs = requests_of(world, 12)
    cfg = gold_cfg(workers=3, batch_size=2, max_inflight=2)
    with RewardPool(cfg, num_workers=1, scorer_factory=LoggedGold(tmp_path / "log", delay_s=0.05)) as pool:
        assert len(pool.workers) == 1 and pool.cfg.pool.workers == 1
        results = pool.score(reqs)
        assert all(r.error is None for r in results)
        assert pool.stats["batches"] == 6
        assert pool.stats["max_inflight"] == 2  # the pool pipelines up to the bound...
        (stats,) = pool.worker_stats()
        assert 1 <= stats["peak_active"] <= 2  # ...and the worker (threaded, 4 slots) never held more


def test_worker_killed_mid_batch_loses_no_sample_and_scores_none_twice(ray_cluster, world, tmp_path):  # noqa: F811
    log = tmp_path / "log"
    reqs = requests_of(world)
    victim_user = reqs[0].user_id
    victim_reqs = [i for i, r in enumerate(reqs) if r.user_id == victim_user]
    hold = victim_reqs[5]  # second batch of the victim's worker, not at a batch boundary
    reqs[hold] = RewardRequest(reqs[hold].request_id + "#hold", victim_user, reqs[hold].question,
                               reqs[hold].response)
    pool = RewardPool(gold_cfg(max_inflight=2), scorer_factory=LoggedGold(log, delay_s=0.02))
    victim = pool.worker_index(victim_user)
    killed, scored = {}, threading.Event()

    def kill_when_held():
        # the kill comes once the held request is being scored and the worker's first batch (in flight beside the
        # second) has been scored too, so that the killed worker has results to keep. The worker scores one batch
        # at a time (its scorer's lock), and its threads may take the two batches in either order: when the held
        # batch won, the first one waits behind it and is never scored there, so after HOLD_ALONE_S of the held
        # request alone the worker is killed anyway (then with nothing delivered). No deadline of its own: it
        # watches as long as the scoring call runs (a loaded machine may take minutes to get there)
        held_since = None
        try:
            while not scored.is_set():
                logged = invocation_log(log)
                seen = logged.get(reqs[hold].request_id)
                first_batch = all(reqs[i].request_id in logged for i in victim_reqs[:4])
                if seen:
                    held_since = held_since or time.monotonic()
                if seen and (first_batch or time.monotonic() - held_since > HOLD_ALONE_S):
                    time.sleep(1.0 if first_batch else 0.0)   # the first batch's last request takes delay_s
                    killed.update(pid=seen[0], worker_id=f"reward-{victim}.1", first_batch_scored=first_batch)
                    ray.kill(pool.workers[victim], no_restart=True)
                    return
                time.sleep(0.02)
        except Exception as exc:  # noqa: BLE001 -- reported by the assertion below, not lost in a thread
            killed["error"] = repr(exc)

    killer = threading.Thread(target=kill_when_held, daemon=True)
    killer.start()
    try:
        results = pool.score(reqs)
        scored.set()
        killer.join(timeout=WAIT_S)
        live = pool.worker_stats()
    finally:
        scored.set()
        pool.close()

    # No sample lost: one result per request, in order, each the gold utility.
    assert [r.request_id for r in results] == [r.request_id for r in reqs]
    for req, res in zip(reqs, results):
        assert res.error is None and res.score == world.gold_utility(req.response, req.user_id)
    logged = invocation_log(log)
    assert "pid" in killed, ("the held request was never killed on its worker", killed,
                             {reqs[i].request_id: logged.get(reqs[i].request_id) for i in victim_reqs[:6]})
    assert pool.stats["restarts"] == 1 and pool.stats["failures"] == 0 and pool.stats["duplicates"] == 0
    assert pool.stats["retries"] >= 1
    by_killed = {r.request_id for r in results if r.worker_id == killed["worker_id"]}
    assert results[hold].worker_id == f"reward-{victim}.2" and results[hold].attempt == 2
    assert by_killed or not killed["first_batch_scored"], killed   # what the killed worker delivered is kept

    # None scored twice: a request is scored again only if its first scoring died with the killed worker.
    pids = invocation_log(log)
    assert set(pids) == {r.request_id for r in reqs}
    for request_id, seen in pids.items():
        survivors = [p for p in seen if p != killed["pid"]]
        assert len(survivors) <= 1, request_id
        if request_id in by_killed:
            assert seen == [killed["pid"]], request_id
        else:
            assert len(survivors) == 1, request_id
    # The live workers' own counters agree: each request they hold was scored there once, and together with
    # what the killed worker delivered they cover every request exactly once.
    counts = Counter()
    for s in live:
        counts.update(s["invocations"])
    assert set(counts.values()) == {1}
    assert sorted(list(counts) + list(by_killed)) == sorted(r.request_id for r in reqs)


def test_requests_that_keep_failing_get_an_error_and_spare_the_others(ray_cluster, world, tmp_path):  # noqa: F811
    log = tmp_path / "log"
    user = world.users[0].user_id
    reqs = [RewardRequest(f"ok{i}", user, "q", "- a list\n- for example") for i in range(7)]
    reqs[2] = RewardRequest("bad#poison", user, "q", "x")
    reqs[5] = RewardRequest("bad#raise", user, "q", "x")
    cfg = gold_cfg(workers=1, batch_size=4, max_inflight=2, max_attempts=2)
    with RewardPool(cfg, scorer_factory=LoggedGold(log)) as pool:
        results = pool.score(reqs)
    by_id = {r.request_id: r for r in results}
    assert [r.request_id for r in results] == [r.request_id for r in reqs]
    assert by_id["bad#poison"].error.startswith("gave_up: 2 attempts; last: worker died")
    assert by_id["bad#raise"].error.startswith("gave_up: 2 attempts; last: call failed: ")
    assert "scorer refuses this request" in by_id["bad#raise"].error
    for r in results:
        if not r.request_id.startswith("bad"):
            assert r.error is None and r.score == world.gold_utility("- a list\n- for example", user)
    assert pool.stats["failures"] == 2 and pool.stats["error_kinds"] == {"gave_up": 2}
    assert pool.stats["restarts"] == 2  # the poison killed its worker on both of its attempts
    assert len(invocation_log(log)["bad#poison"]) == 2


def test_genrm_pool_on_a_real_engine_counts_parse_failures(ray_cluster):  # noqa: F811
    """The tiny random model writes no valid SEC: every reward is an error of a parser kind, counted, never
    retried and never a made-up score."""
    cfg = reward_config(kind="genrm", judge=engine_config(backend="hf", model="tiny", max_model_len=1024),
                        generation=GenerationConfig(max_tokens=8),
                        pool={"workers": 1, "num_cpus": 0.5, "batch_size": 4})
    reqs = [RewardRequest(f"g{i}", "u1", "How do I boil an egg?", f"Answer {i}.", {"reference": "Boil it."})
            for i in range(5)] + [RewardRequest("noref", "u1", "q", "a")]
    with RewardPool(cfg) as pool:
        results = pool.score(reqs)
    assert all(r.score is None and r.error for r in results)
    assert results[-1].error.startswith("missing_reference")
    assert pool.stats["failures"] == len(reqs) and pool.stats["retries"] == 0
    assert sum(pool.stats["error_kinds"].values()) == len(reqs)


# ---------------------------------------------------------------------------------------------------------------
# Scorers in-process
# ---------------------------------------------------------------------------------------------------------------

def test_gold_normalized_is_the_utility_rescaled_to_the_users_range(world):
    raw = GoldScorer(reward_config(kind="gold", world=WORLD))
    norm = GoldScorer(reward_config(kind="gold", world=WORLD, normalize=True))
    reqs = requests_of(world, 16)
    for req, (u, _), (v, _) in zip(reqs, raw.score(reqs), norm.score(reqs)):
        w = world.user_weights(req.user_id).values()
        low, high = sum(min(x, 0) for x in w), sum(max(x, 0) for x in w)
        assert 0.0 <= v <= 1.0 and v == pytest.approx((u - low) / (high - low))


class StubEngine:
    """Answers planner prompts with two aspects and judge prompts with a fixed SEC (or pointwise) text."""

    name = "stub"

    def __init__(self, judge_text):
        self.judge_text, self.prompts = judge_text, []

    def generate(self, prompts, params):
        self.prompts += prompts
        return [Generation(samples=[Sample(text="1. short answers\n2. examples"
                                           if "Aspects this user expects" in p[-1]["content"] else self.judge_text)])
                for p in prompts]


def sec_text(s1, s2):
    return format_sec(SEC(persona="likes lists", criteria=[Criterion("lists", 1.0)],
                          scores=[CriterionScore("lists", s1, s2)], final={"response_1": s1, "response_2": s2}))


def test_genrm_sec_reference_rewards_the_final_score_of_response_1():
    cfg = reward_config(kind="genrm")
    engine = StubEngine(sec_text(7.5, 3.0))
    scorer = GenRMScorer(cfg, engine=engine)
    reqs = [RewardRequest("a", "u", "How?", "My answer.", {"reference": "Ref answer."}),
            RewardRequest("b", "u", "How?", "Other.")]
    assert scorer.score(reqs) == [(7.5, None), (None, "missing_reference: sec_reference needs meta['reference']")]
    (prompt,) = engine.prompts  # the request without a reference never reached the engine
    text = prompt[-1]["content"]
    assert text.index("My answer.") < text.index("Ref answer.")  # response in slot 1, reference in slot 2


def test_genrm_pointwise_and_planner_paths():
    judge = engine_config(backend="hf", model="tiny")
    cfg = reward_config(kind="genrm", genrm_mode="pointwise", judge=judge, planner=judge, input_mode="plan")
    engine = StubEngine("Fits well.\nScore: 8")
    scorer = GenRMScorer(cfg, engine=engine)
    meta = {"retrieved": [{"id": "p1", "text": "I love bullet lists."}]}
    assert scorer.score([RewardRequest("a", "u", "How?", "Answer.", meta)]) == [(8.0, None)]
    assert len(engine.prompts) == 2  # planner, then judge (one engine shared: the configs are equal)
    assert "short answers" in engine.prompts[1][-1]["content"]  # the plan's aspects reached the judge
    engine.judge_text = "no score here"
    assert scorer.score([RewardRequest("b", "u", "How?", "Answer.", meta)]) == [(None, "no_score")]


def test_scalar_scorer_scores_deterministically():
    scorer = ScalarScorer(reward_config(kind="scalar", input_mode="profile"))
    meta = {"retrieved": [{"id": "p1", "text": "I love bullet lists."}]}
    reqs = [RewardRequest("a", "u", "How?", "- one\n- two", meta), RewardRequest("b", "u", "How?", "Plain.")]
    first, second = scorer.score(reqs), scorer.score(reqs[::-1])[::-1]
    assert all(err is None and isinstance(s, float) for s, err in first)
    assert [s for s, _ in first] == pytest.approx([s for s, _ in second], abs=1e-5)


def test_reward_config_validation_and_light_import():
    with pytest.raises(ValueError, match="http"):
        reward_config(kind="http")
    assert reward_config(kind="http", judge=engine_config(backend="openai", model="judge")).kind == "http"
    with pytest.raises(ValueError, match="planner"):
        reward_config(kind="genrm", input_mode="plan")
    with pytest.raises(ValueError, match="input_mode"):
        reward_config(kind="genrm", planner=engine_config())
    with pytest.raises(ValueError):
        reward_config(kind="gold", pool={"workers": 0})
    code = ("import sys, pr_rlhf.configs.recipe, pr_rlhf.configs.reward as c; c.reward_config(kind='gold'); "
            "assert not {'torch', 'ray', 'numpy'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_reward_config_imports_on_its_own():
    """Ray workers unpickle a RewardConfig by importing its module first: that must work without pr_rlhf.configs.recipe
    having been imported before (a circular import at pr_rlhf.configs.recipe's end breaks exactly this)."""
    code = "import pr_rlhf.configs.reward as c; c.reward_config(kind='gold')"
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-1500:]
