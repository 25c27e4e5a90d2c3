"""The local engines agree: hf (shared-prefix decoding) and vllm give the same greedy tokens, logprobs and
continuation scores on the same tiny float32 model, and prefix sharing changes nothing but speed."""
import os

import pytest

from pr_rlhf.configs.recipe import engine_config
from pr_rlhf.models import Engine, SamplingParams, make_engine
from pr_rlhf.models.sources import resolve_model

MAX_LEN = 1024
PROMPTS = [
    "Hello world, tell me about cats.",
    [{"role": "user", "content": "What should I cook tonight? I like spicy food."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Plan a trip to the coast."}],
    "A",
    "The weather in Paris is mild in spring. " * 12,
]
RUBRIC = [{"role": "user", "content": "Profile: likes short answers, bullet lists, and examples. " * 12
           + "Rate the answer below from 1 to 10."}]
CANDIDATES = ["Great answer, 9/10.", "Terrible.", "",
              "It is fine I think, maybe a 5 out of 10 because it lacks detail.", "T", "- one\n- two, for example!"]


@pytest.fixture(scope="module")
def model_dir():
    return resolve_model("tiny")


@pytest.fixture(scope="module")
def hf(model_dir):
    from pr_rlhf.models.hf_engine import HFEngine

    engine = HFEngine(model_dir, max_model_len=MAX_LEN, max_batch_sequences=8)  # small: exercises chunking
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def vllm_engine(model_dir):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from pr_rlhf.models.vllm_engine import VLLMEngine

    engine = VLLMEngine(model_dir, dtype="float32", max_model_len=MAX_LEN, seed=0, enable_prefix_caching=True)
    yield engine
    engine.close()


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_hf_and_vllm_give_identical_tokens(hf, vllm_engine, n):
    params = SamplingParams(n=n, max_tokens=32, logprobs=True)
    for a, b in zip(hf.generate(PROMPTS, params), vllm_engine.generate(PROMPTS, params)):
        assert a.ok and b.ok
        assert a.prompt_token_ids == b.prompt_token_ids
        assert len(a.samples) == len(b.samples) == n
        for x, y in zip(a.samples, b.samples):
            assert x.token_ids == y.token_ids
            assert x.text == y.text
            assert x.finish_reason == y.finish_reason == "length"
            assert len(x.logprobs) == len(y.logprobs) == len(x.token_ids) == 32
            assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs)) < 1e-4
            assert all(v <= 0 for v in x.logprobs)


def test_stop_strings_and_eos_conventions_match(hf, vllm_engine):
    first = hf.generate(PROMPTS[:1], SamplingParams(max_tokens=32))[0].samples[0]
    stop = first.text[5:9]
    params = SamplingParams(max_tokens=32, stop=(stop,))
    for a, b in zip(hf.generate(PROMPTS, params), vllm_engine.generate(PROMPTS, params)):
        x, y = a.samples[0], b.samples[0]
        assert (x.token_ids, x.text, x.finish_reason) == (y.token_ids, y.text, y.finish_reason)
        assert stop not in x.text
    hit = hf.generate(PROMPTS[:1], params)[0].samples[0]
    assert hit.finish_reason == "stop" and first.text.startswith(hit.text) and len(hit.token_ids) < 32


def test_hf_shared_prefix_equals_naive(hf, model_dir):
    import torch

    from pr_rlhf.models.hf_engine import HFEngine

    # Greedy against transformers' own generate on each prompt alone.
    for gen in hf.generate(PROMPTS, SamplingParams(n=2, max_tokens=24)):
        ids = torch.tensor([gen.prompt_token_ids])
        ref = hf.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                pad_token_id=hf.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        assert [s.token_ids for s in gen.samples] == [ref, ref]
    # Sampling: one prefill expanded to n rows == n full copies of the prompt, draw for draw.
    naive = HFEngine(model_dir, max_model_len=MAX_LEN, max_batch_sequences=8, share_prefix=False)
    params = SamplingParams(n=4, temperature=1.0, top_p=0.9, max_tokens=16, seed=7, logprobs=True)
    shared_out, naive_out = hf.generate(PROMPTS, params), naive.generate(PROMPTS, params)
    for a, b in zip(shared_out, naive_out):
        assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]
        for x, y in zip(a.samples, b.samples):
            assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs)) < 1e-4
    naive.close()


def test_hf_seeded_sampling(hf):
    params = SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=3)
    once = [[s.token_ids for s in g.samples] for g in hf.generate(PROMPTS, params)]
    # Same seed, other batch composition and order: same samples (one generator per prompt).
    again = [[s.token_ids for s in g.samples] for g in hf.generate(PROMPTS[::-1], params)][::-1]
    alone = [s.token_ids for s in hf.generate(PROMPTS[1:2], params)[0].samples]
    assert once == again and once[1] == alone
    assert len({tuple(t) for t in once[0]}) > 1  # the n samples differ
    other = [[s.token_ids for s in g.samples] for g in hf.generate(PROMPTS, SamplingParams(
        n=4, temperature=1.0, max_tokens=12, seed=4))]
    assert other != once


def test_vllm_seeded_sampling(vllm_engine):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=3, logprobs=True)
    a, b = vllm_engine.generate(PROMPTS[:2], params), vllm_engine.generate(PROMPTS[:2], params)
    assert [[s.token_ids for s in g.samples] for g in a] == [[s.token_ids for s in g.samples] for g in b]
    assert all(len(s.logprobs) == len(s.token_ids) for g in a for s in g.samples)


def test_logprobs_only_when_asked(hf, vllm_engine):
    for engine in (hf, vllm_engine):
        gen = engine.generate(PROMPTS[:2], SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=1))
        assert all(s.logprobs is None and len(s.token_ids) == 8 for g in gen for s in g.samples)


def test_too_long_prompt_fails_alone(hf, vllm_engine):
    prompts = ["word " * (MAX_LEN + 10), PROMPTS[0]]
    for engine in (hf, vllm_engine):
        bad, good = engine.generate(prompts, SamplingParams(max_tokens=4))
        assert not bad.ok and "tokens" in bad.error
        assert good.ok and len(good.samples[0].token_ids) == 4


def test_hf_score_continuations_shared_equals_naive(hf):
    shared = hf.score_continuations(RUBRIC, CANDIDATES)
    naive = hf.score_continuations_naive(RUBRIC, CANDIDATES)
    assert shared[2] == naive[2] == 0.0  # empty continuation
    assert max(abs(a - b) for a, b in zip(shared, naive)) < 1e-4
    assert all(s < 0 for i, s in enumerate(shared) if i != 2)
    # more candidates than one batch (max_batch_sequences=8): chunked, same values
    many = CANDIDATES * 3
    assert max(abs(a - b) for a, b in zip(hf.score_continuations(RUBRIC, many), shared * 3)) < 1e-4


def test_score_continuations_hf_equals_vllm(hf, vllm_engine):
    expected = hf.score_continuations(RUBRIC, CANDIDATES)
    for _ in range(2):  # the second pass reads the prefix from vLLM's cache
        got = vllm_engine.score_continuations(RUBRIC, CANDIDATES)
        assert max(abs(a - b) for a, b in zip(expected, got)) < 1e-3
    # Long identical continuations scored twice: the cache then reaches into the continuation itself, whose
    # prompt logprobs vLLM does not recompute; the engine detects it and rescoring without the cache.
    long_cands = ["I like it a lot, " * 60, "I like it a lot, " * 60 + "really."]
    expected = hf.score_continuations(RUBRIC, long_cands)
    before = vllm_engine.uncached_rescores
    for _ in range(2):
        got = vllm_engine.score_continuations(RUBRIC, long_cands)
        assert max(abs(a - b) for a, b in zip(expected, got)) < 1e-3
    assert vllm_engine.uncached_rescores > before


def test_make_engine_builds_the_named_backend(model_dir):
    engine = make_engine(engine_config(backend="hf", model=model_dir, max_model_len=MAX_LEN))
    assert isinstance(engine, Engine) and engine.name == "hf"
    assert engine.generate([PROMPTS[0]], SamplingParams(max_tokens=3))[0].ok
    engine.close()
    remote = make_engine(engine_config(backend="openai", model="tiny", base_url="http://127.0.0.1:9/v1"))
    assert isinstance(remote, Engine) and remote.name == "openai" and remote.model == model_dir
