"""RolloutWorker actors (hf and vllm, float32 tiny model; vLLM in its default multiprocess runtime): n samples with
token ids and logprobs, and (hf) loading a state dict: after loading the weights of a second tiny model (another
seed), the greedy output equals that of an HF model loaded from those weights on disk. The weight sync into vLLM
engines goes through vLLM's weight-transfer API: tests/integration/test_weight_sync.py."""
import shutil

import pytest

from pr_rlhf.configs.recipe import EngineConfig, engine_config
from pr_rlhf.models import SamplingParams
from pr_rlhf.models.sources import resolve_model
from tests.optional import need
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.rollout import RolloutWorker, spawn_rollout_worker

ray = need("ray")

MAX_LEN = 512
PROMPTS = [
    "Hello world, tell me about cats.",
    [{"role": "user", "content": "What should I cook tonight? I like spicy food."}],
    "A",
]
GREEDY = SamplingParams(max_tokens=24, logprobs=True)


def engine_cfg(backend: str, model: str = "tiny") -> EngineConfig:
    return engine_config(backend=backend, model=model, dtype="float32", max_model_len=MAX_LEN, seed=0)


@pytest.fixture(scope="module")
def rollouts(ray_cluster):  # noqa: F811
    actors = {
        "hf": spawn_rollout_worker(engine_cfg("hf"), num_cpus=0.5),
        # TORCH_COMPILE_DISABLE: vLLM compiles its logprob-rank kernel on the first logprobs request (7-16 s on
        # CPU); eager is as exact and instant for a tiny model.
        "vllm": spawn_rollout_worker(engine_cfg("vllm"), num_cpus=1,
                                     env={"VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1"}),
    }
    ray.get([a.ready.remote() for a in actors.values()], timeout=600)
    yield actors
    for actor in actors.values():
        ray.kill(actor)


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory):
    """(state dict, model dir) of a second tiny model: same architecture and tokenizer, weights of seed 1."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    src = resolve_model("tiny")
    out = tmp_path_factory.mktemp("tiny-seed1") / "model"
    shutil.copytree(src, out)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32).eval()
    model.generation_config = GenerationConfig.from_pretrained(src)
    model.save_pretrained(out, safe_serialization=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, str(out)


def greedy(actor) -> list:
    return ray.get(actor.generate.remote(PROMPTS, GREEDY), timeout=300)


def test_generate_n_samples_with_token_ids_and_logprobs(rollouts):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=7, logprobs=True)
    for name, actor in rollouts.items():
        gens = ray.get(actor.generate.remote(PROMPTS, params), timeout=300)
        assert len(gens) == len(PROMPTS), name
        for gen in gens:
            assert gen.ok and gen.prompt_token_ids, name
            assert len(gen.samples) == 3
            for sample in gen.samples:
                assert 0 < len(sample.token_ids) == len(sample.logprobs) <= 12
                assert all(lp <= 0 for lp in sample.logprobs)
    # Before any update both rollouts hold the same weights: greedy tokens agree.
    hf, vl = greedy(rollouts["hf"]), greedy(rollouts["vllm"])
    assert [g.samples[0].token_ids for g in hf] == [g.samples[0].token_ids for g in vl]


def test_hf_load_weights_then_greedy_equals_hf_holding_those_weights(rollouts, perturbed):
    from pr_rlhf.models.hf_engine import HFEngine

    state, model_dir = perturbed
    reference = HFEngine(model_dir, max_model_len=MAX_LEN)
    try:
        expected = reference.generate(PROMPTS, GREEDY)
    finally:
        reference.close()
    hf = {"hf": rollouts["hf"]}   # the state-dict path exists for the HF engine only (bench/weight_sync.py's baseline)
    before = {name: greedy(actor) for name, actor in hf.items()}
    versions = {name: ray.get(actor.get_weights_version.remote()) for name, actor in hf.items()}
    ref = ray.put(state)
    new_versions = ray.get([a.load_weights.remote(ref) for a in hf.values()], timeout=300)
    assert new_versions == [versions[n] + 1 for n in hf]
    for name, actor in hf.items():
        after = greedy(actor)  # the same prompts as before: a stale prefix cache would show here
        assert [g.samples[0].token_ids for g in after] == [g.samples[0].token_ids for g in expected], name
        assert [g.samples[0].text for g in after] == [g.samples[0].text for g in expected], name
        for got, want in zip(after, expected):
            diffs = [abs(a - b) for a, b in zip(got.samples[0].logprobs, want.samples[0].logprobs)]
            assert max(diffs) < 1e-4, name
        assert ([g.samples[0].token_ids for g in after] != [g.samples[0].token_ids for g in before[name]]), \
            f"{name}: the new weights changed nothing; the test would prove nothing"
    assert ray.get(rollouts["hf"].load_weights.remote(ref, version=42)) == 42


def test_rollout_worker_rejects_http_backend():
    with pytest.raises(ValueError, match="local engine"):
        RolloutWorker(engine_config(backend="openai", model="x"))


def test_hf_load_weights_rejects_a_state_dict_of_another_model(perturbed):
    from pr_rlhf.models.hf_engine import HFEngine

    state, model_dir = perturbed
    engine = HFEngine(model_dir, max_model_len=MAX_LEN)
    try:
        engine.load_weights({k: v for k, v in state.items() if k != "lm_head.weight"})  # tied: may be left out
        bad = {k: v for k, v in state.items() if "layers.1." not in k}
        with pytest.raises(ValueError, match="missing"):
            engine.load_weights(bad)
        with pytest.raises(ValueError, match="unexpected"):
            engine.load_weights({**state, "model.layers.9.mlp.up_proj.weight": state["model.norm.weight"]})
    finally:
        engine.close()
