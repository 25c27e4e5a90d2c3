"""The HTTP engine against a real vLLM OpenAI server on the tiny model (loopback only), directly and through a
fault-injecting reverse proxy: slow responses, 5xx bursts, 4xx, and the server killed in the middle of a run."""
import asyncio
import http.server
import logging
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from pr_rlhf.models import SamplingParams
from pr_rlhf.models.openai_engine import OpenAIEngine, ScoringUnsupportedError
from pr_rlhf.models.sources import resolve_model
from tests.vllm_server import serve, stop_server

SECRET = "sk-test-7f3a9c-never-shown"
KEY_ENV = "PR_RLHF_TEST_JUDGE_KEY"
PROMPTS = ["Hello world, tell me about cats.",
           [{"role": "user", "content": "What should I cook tonight? I like spicy food."}]]


@pytest.fixture(scope="module")
def model_dir():
    return resolve_model("tiny")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    with serve(model_dir, tmp_path_factory.mktemp("vllm_server")) as info:
        yield info


@pytest.fixture()
def secret_env(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


class FaultProxy:
    """A reverse proxy on 127.0.0.1 that can delay requests or answer errors before forwarding to upstream."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.lock = threading.Lock()
        self.delay_s = 0.0
        self.fail_statuses: list[int] = []   # answered, in order, to the next requests
        self.retry_after: str | None = None
        self.seen = 0
        self.auth_headers: list[str] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with proxy.lock:
                    proxy.seen += 1
                    proxy.auth_headers.append(self.headers.get("authorization", ""))
                    status = proxy.fail_statuses.pop(0) if proxy.fail_statuses else None
                    delay = proxy.delay_s
                try:
                    if status is not None:
                        self._answer(status, b'{"error": "injected fault"}')
                        return
                    time.sleep(delay)
                    request = urllib.request.Request(proxy.upstream + self.path, data=body, method="POST",
                                                     headers={"content-type": "application/json"})
                    try:
                        with urllib.request.urlopen(request, timeout=30) as response:
                            self._answer(response.status, response.read())
                    except urllib.error.HTTPError as err:
                        self._answer(err.code, err.read())
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout) before we answered
                except (urllib.error.URLError, OSError):
                    try:  # upstream gone (a late delayed request after the server was stopped)
                        self._answer(502, b'{"error": "upstream unreachable"}')
                    except OSError:
                        pass

            def _answer(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                if status == 429 and proxy.retry_after:
                    self.send_header("retry-after", proxy.retry_after)
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def proxy(server):
    # The upstream is the server root; the proxy keeps the request path (/v1/...).
    fault_proxy = FaultProxy(server["url"].rsplit("/v1", 1)[0])
    yield fault_proxy
    fault_proxy.close()


def engine_for(url: str, model_dir: str, **kwargs) -> OpenAIEngine:
    defaults = {"api_key_env": KEY_ENV, "concurrency": 4, "timeout_s": 20.0, "max_retries": 3, "backoff_s": 0.05,
                "tokenizer_dir": model_dir}
    return OpenAIEngine(url, model_dir, **{**defaults, **kwargs})


def test_generate_and_score_over_http(server, model_dir, secret_env):
    from pr_rlhf.models.hf_engine import HFEngine

    engine = engine_for(server["url"], model_dir)
    sampled = engine.generate(PROMPTS, SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=1, logprobs=True))
    for gen in sampled:
        assert gen.ok and len(gen.samples) == 3 and gen.prompt_token_ids
        for sample in gen.samples:
            assert len(sample.token_ids) == len(sample.logprobs) == 8 and sample.finish_reason == "length"
    assert engine.usage["completion_tokens"] == 2 * 3 * 8 and engine.usage["prompt_tokens"] > 0   # the server's count
    # Greedy over HTTP gives exactly the local hf engine's tokens (same model, float32).
    hf = HFEngine(model_dir, max_model_len=1024)
    remote = engine.generate(PROMPTS, SamplingParams(n=2, max_tokens=24))
    local = hf.generate(PROMPTS, SamplingParams(n=2, max_tokens=24))
    for a, b in zip(remote, local):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]
        assert a.samples[0].text == b.samples[0].text
    # Scoring with echo + prompt logprobs matches the local engine's shared-prefix scores.
    cands = ["Great answer, 9/10.", "Terrible.", ""]
    got = engine.score_continuations(PROMPTS[1], cands)
    want = hf.score_continuations(PROMPTS[1], cands)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3 and got[2] == 0.0
    # Without a local tokenizer: text prompts only (a chat prefix needs the template).
    bare = engine_for(server["url"], model_dir, tokenizer_dir=None)
    assert all(s < 0 for s in bare.score_continuations("Rate this: ", cands[:2]))
    with pytest.raises(ScoringUnsupportedError):
        bare.score_continuations(PROMPTS[1], cands)
    # The sync wrapper works from inside a running event loop (it runs its own loop in a thread).
    async def inside_a_loop():
        return engine.generate(PROMPTS[:1], SamplingParams(max_tokens=4))
    assert asyncio.run(inside_a_loop())[0].ok
    assert engine.stats["failures"] == 0 and engine.stats["retries"] == 0
    hf.close()


def test_transient_5xx_and_429_are_retried(proxy, model_dir, secret_env):
    proxy.fail_statuses = [500, 503, 429]
    proxy.retry_after = "0.1"
    engine = engine_for(proxy.url + "/v1", model_dir, concurrency=1)
    gens = engine.generate(PROMPTS, SamplingParams(max_tokens=4))
    assert all(g.ok for g in gens)
    assert engine.stats["retries"] == 3 and engine.stats["failures"] == 0
    assert proxy.seen == 5


def test_4xx_is_not_retried_and_the_key_never_leaks(proxy, model_dir, secret_env, caplog):
    caplog.set_level(logging.DEBUG)
    proxy.fail_statuses = [400, 500, 500, 500, 500]
    engine = engine_for(proxy.url + "/v1", model_dir, concurrency=1, max_retries=3)
    bad_request = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=4))[0]
    assert not bad_request.ok and "HTTP 400" in bad_request.error
    assert engine.stats == {"requests": 1, "retries": 0, "failures": 1, "fallbacks": 0}
    exhausted = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=4))[0]
    assert not exhausted.ok and "HTTP 500" in exhausted.error and "4 attempts" in exhausted.error
    assert engine.stats["retries"] == 3 and engine.stats["failures"] == 2
    # The key went out as a Bearer token, and appears nowhere else.
    assert proxy.auth_headers and all(h == f"Bearer {SECRET}" for h in proxy.auth_headers)
    for text in (repr(engine), str(engine), str(engine.stats), bad_request.error, exhausted.error, caplog.text,
                 repr(engine.__dict__)):
        assert SECRET not in text


def test_slow_responses_time_out_retry_and_fail(proxy, model_dir, secret_env):
    proxy.delay_s = 3.0
    engine = engine_for(proxy.url + "/v1", model_dir, concurrency=4, timeout_s=0.5, max_retries=1)
    start = time.monotonic()
    gens = engine.generate(PROMPTS * 2, SamplingParams(max_tokens=4))
    elapsed = time.monotonic() - start
    assert all(not g.ok and "timeout" in g.error for g in gens)
    assert engine.stats["failures"] == 4 and engine.stats["retries"] == 4
    assert elapsed < 2.5  # two 0.5 s attempts with a short backoff, all four in parallel


def test_overall_deadline_bounds_a_call(proxy, model_dir, secret_env):
    proxy.delay_s = 2.0
    engine = engine_for(proxy.url + "/v1", model_dir, concurrency=1, timeout_s=10.0, deadline_s=1.0)
    start = time.monotonic()
    gens = engine.generate(PROMPTS, SamplingParams(max_tokens=4))
    assert time.monotonic() - start < 2.0
    assert all(not g.ok and "deadline" in g.error for g in gens) and engine.stats["failures"] == 2


# Runs last in this module: it kills the shared server.
def test_server_killed_mid_run_fails_fast(server, model_dir, secret_env):
    engine = engine_for(server["url"], model_dir, concurrency=2, timeout_s=10.0, max_retries=3, backoff_s=0.1)
    # Every send after the fourth waits until the server is dead: the kill lands mid-run however the machine
    # schedules this thread (a loaded CI machine once let all 60 finish before the test's thread ran again).
    killed, sends = threading.Event(), []
    post_once = engine._post_once

    async def post_once_after_the_kill(client, path, body):
        sends.append(path)
        while len(sends) > 4 and not killed.is_set():
            await asyncio.sleep(0.01)
        return await post_once(client, path, body)

    engine._post_once = post_once_after_the_kill
    prompts = [f"Tell me a long story number {i} about the sea." for i in range(60)]
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(
        gens=engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=256, seed=0))))
    start = time.monotonic()
    worker.start()
    while len(sends) <= 4 and time.monotonic() - start < 60:
        time.sleep(0.02)
    assert len(sends) > 4, "the run never got past its first four requests"
    stop_server(server["proc"], signal.SIGKILL)  # a crash, not a graceful shutdown that drains requests
    killed_at = time.monotonic()
    killed.set()
    worker.join(timeout=60)
    assert not worker.is_alive(), "generate hung after the server died"
    gens = result["gens"]
    failed = [g for g in gens if not g.ok]
    assert len(gens) == 60 and len(failed) >= 56 and len(failed) == engine.stats["failures"]
    assert any("server unreachable" in g.error for g in failed)  # the rest failed fast, without retrying
    assert engine.stats["requests"] < 60
    assert time.monotonic() - killed_at < 10


def test_rubric_judge_and_genrm_as_reward_scorers_over_http(server, model_dir, secret_env):
    """The downstream rubric judge (both modes) and the pointwise GenRM as reward scorers on the served model:
    every request gets a score or a named failure (the tiny model writes no grades), nothing raises, a request
    without a rubric never reaches the server."""
    from pr_rlhf.configs.base import GenerationConfig, engine_config
    from pr_rlhf.configs.reward import reward_config
    from pr_rlhf.scorers import RewardRequest, build_scorer

    judge = engine_config(backend="openai", model=model_dir, base_url=server["url"], api_key_env=KEY_ENV)
    rubric = [{"aspect": "Gives a concrete example", "reason": "asks for examples", "evidence": "post 3"},
              {"aspect": "Stays short"}]
    reqs = [RewardRequest("a", "u1", "How do I start a film club?", "Pick a film, invite friends.",
                          {"rubric": rubric, "narrative": "I run a small club."}),
            RewardRequest("b", "u1", "How?", "Anyhow.", {})]
    for mode, sends in (("all", 1), ("per_aspect", 2)):
        scorer = build_scorer(reward_config(kind="rubric", rubric_mode=mode, judge=judge,
                                            generation=GenerationConfig(max_tokens=12)))
        (score_a, error_a), (score_b, error_b) = scorer.score(reqs)
        assert (score_a is None) != (error_a is None) and (score_a is None or 0.0 <= score_a <= 1.0)
        assert score_b is None and error_b.startswith("no_aspects")
        assert scorer.engine.stats["requests"] == sends       # one call per answer, or per aspect
        scorer.close()
    genrm = build_scorer(reward_config(kind="http", genrm_mode="pointwise", judge=judge,
                                       generation=GenerationConfig(max_tokens=12)))
    ((score, error),) = genrm.score(reqs[:1])
    assert (score is None) != (error is None)
    genrm.close()
