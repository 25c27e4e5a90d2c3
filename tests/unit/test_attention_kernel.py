"""The attention kernel of every model the learner builds, decided on CPU with CUDA and flash-attn faked.

``pr_rlhf.rl.modeling.attention_for`` is what the learner calls per model; here it is checked for each GPU recipe's
learner config, plus the two facts the decision rests on: attention sees the *compute* dtype of float32-stored
models (FSDP2 mixed precision, autocast), and only the policy / reference log-probs feed the packed 4-D mask."""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.configs.recipe import load_recipe
from pr_rlhf.rl import modeling
from pr_rlhf.rl.forward import response_logprobs, response_values, sequence_rewards
from pr_rlhf.rl.modeling import (
    AttentionConfigError,
    attention_for,
    fed_4d_mask,
    learner_roles,
    pick_attn_implementation,
)

ROOT = Path(__file__).resolve().parents[2]
GPU_RECIPES = sorted((ROOT / "recipes" / "gpu").glob("*.yaml"))
FA2, SDPA = "flash_attention_2", "sdpa"
F32, BF16 = torch.float32, torch.bfloat16

# (load dtype, kernel) of every model each GPU recipe's learner builds, on CUDA with flash-attn installed. The
# GRPO learners pack each group's shared prompt behind a 4-D mask (shared_prefix), so their policy and reference
# take sdpa; PPO with one sample per prompt has nothing to pack and turns shared_prefix off to get flash-attention 2.
EXPECTED = {
    "ppo_personalized.yaml": {"policy": (F32, FA2), "reference": (BF16, FA2), "critic": (F32, FA2)},
    "pgenrm_pipeline.yaml": {"policy": (F32, SDPA), "reference": (BF16, SDPA)},
    "pgenrm_real.yaml": {"policy": (F32, SDPA), "reference": (BF16, SDPA)},
    "rm_bt.yaml": {"reward_model": (F32, FA2)},
    "bon_sweep.yaml": {},   # no learner: the policy samples on vLLM, the RMs score in reward workers
}


def recipe_learner(path: Path) -> LearnerConfig | None:
    """The learner config a GPU recipe's driver builds its ``LearnerGroup`` from (the drivers change only model,
    lr, seed, temperature, threads and the KL on it: nothing that picks a kernel)."""
    recipe = load_recipe(path)
    for section in (recipe.train, recipe.pgenrm, recipe.rm):
        if section is not None:
            return section.learner
    return None


@pytest.fixture
def fake_gpu(monkeypatch):
    """CUDA visible and flash-attn importable, as on a GPU node with the `gpu` extra."""
    monkeypatch.setattr(modeling, "flash_attn_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_every_gpu_recipe_is_covered():
    assert sorted(p.name for p in GPU_RECIPES) == sorted(EXPECTED)


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.stem)
def test_kernel_of_every_learner_model(path, fake_gpu):
    cfg = recipe_learner(path)
    expected = EXPECTED[path.name]
    if cfg is None:
        assert expected == {}
        return
    assert cfg.device == "cuda" and cfg.dtype == "bfloat16" and cfg.strategy == "fsdp2"
    assert set(learner_roles(cfg)) == set(expected)
    for role in learner_roles(cfg):
        # the device as the worker passes it, and as resolved from the config
        assert attention_for(cfg, role, "cuda") == expected[role], role
        assert attention_for(cfg, role) == expected[role], role
        if fed_4d_mask(cfg, role):
            assert attention_for(cfg, role, "cuda")[1] != FA2, f"{path.name}: {role} is fed the 4-D mask"
    # auto device resolves to the faked CUDA
    auto = cfg.model_copy(update={"device": "auto"})
    assert {r: attention_for(auto, r) for r in learner_roles(auto)} == expected


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.stem)
def test_without_flash_attn_or_gpu_everything_is_sdpa(path, monkeypatch):
    cfg = recipe_learner(path)
    if cfg is None:
        return
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    assert {attention_for(cfg, r, "cuda")[1] for r in learner_roles(cfg)} == {SDPA}
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert {attention_for(cfg, r, "cpu")[1] for r in learner_roles(cfg)} == {SDPA}


def test_an_installed_flash_attn_that_does_not_import_falls_back_to_sdpa(monkeypatch, caplog):
    """A source build against another torch is installed (find_spec finds it) but raises on import."""
    real_find, real_import = importlib.util.find_spec, importlib.import_module

    def broken_import(name, *a):
        if name == "flash_attn":
            raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c105ErrorC2E")
        return real_import(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "flash_attn" else real_find(name, *a))
    monkeypatch.setattr(importlib, "import_module", broken_import)
    modeling._flash_attn_imports.cache_clear()
    try:
        assert pick_attn_implementation("auto", "cuda", torch.bfloat16) == SDPA
        assert "does not import" in caplog.text and "undefined symbol" in caplog.text
    finally:
        modeling._flash_attn_imports.cache_clear()


def test_the_4d_mask_rule(fake_gpu):
    grpo = LearnerConfig(device="cuda", dtype="bfloat16", kl={"coef": 0.02}, critic={"enabled": True})
    assert grpo.shared_prefix
    assert {r: attention_for(grpo, r)[1] for r in learner_roles(grpo)} == \
        {"policy": SDPA, "reference": SDPA, "critic": FA2}
    flat = grpo.model_copy(update={"shared_prefix": False})
    assert {attention_for(flat, r)[1] for r in learner_roles(flat)} == {FA2}
    # float32 compute never takes flash-attention (16-bit only), whatever the mask
    assert {attention_for(flat.model_copy(update={"dtype": "float32"}), r)[1] for r in learner_roles(flat)} == {SDPA}
    # strategy 'none' keeps the reference in float32 (its Strategy.reference_dtype) but computes under autocast
    plain = flat.model_copy(update={"strategy": "none"})
    assert attention_for(plain, "reference") == (F32, FA2)


def test_explicit_flash_attention_that_cannot_work_is_a_config_error(fake_gpu):
    packed = LearnerConfig(device="cuda", dtype="bfloat16", attn_implementation="flash_attention_2")
    with pytest.raises(AttentionConfigError, match="shared_prefix") as err:
        attention_for(packed, "critic")   # any model: the learner as a whole cannot be built
    assert "policy and reference" in str(err.value) and "39608" in str(err.value)
    with pytest.raises(AttentionConfigError, match="4-D"):
        modeling.pick_attn_implementation("flash_attention_2", "cuda", BF16, mask_4d=True)
    with pytest.raises(AttentionConfigError, match="learner.dtype"):
        attention_for(packed.model_copy(update={"shared_prefix": False, "dtype": "float32"}), "policy")
    # fine: no model fed the 4-D mask (the reward model's scores take 2-D masks), or no packing
    rm = LearnerConfig(trains="reward_model", device="cuda", dtype="bfloat16", attn_implementation="flash_attention_2")
    assert attention_for(rm, "reward_model") == (F32, FA2)
    assert attention_for(packed.model_copy(update={"shared_prefix": False}), "policy") == (F32, FA2)
    # an explicit sdpa / eager stands
    assert attention_for(packed.model_copy(update={"attn_implementation": "eager"}), "policy")[1] == "eager"


# ---------------------------------------------------------------------------------------- what the rule rests on
class _Recorder(torch.nn.Module):
    """Stands for a model: records the attention mask each call gets."""

    def __init__(self, out):
        super().__init__()
        self.masks: list[torch.Tensor] = []
        self.out = out

    def forward(self, input_ids, attention_mask, position_ids, **kw):
        self.masks.append(attention_mask)
        return self.out(input_ids, kw)


def _grpo_micro_batch() -> dict[str, torch.Tensor]:
    """Two samples of one prompt and one of another: the first two share their prompt."""
    prompt = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1]])
    response = torch.tensor([[3, 4], [4, 0], [3, 3]])
    rmask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    return {"prompt_ids": prompt, "prompt_mask": mask, "response_ids": response, "response_attention_mask": rmask}


def test_only_policy_and_reference_logprobs_feed_a_4d_mask():
    from contextlib import nullcontext

    mb, cpu, ctx = _grpo_micro_batch(), torch.device("cpu"), nullcontext()
    lm = _Recorder(lambda ids, kw: SimpleNamespace(
        logits=torch.zeros(ids.shape[0], kw.get("logits_to_keep", ids.shape[1]), 16)))
    response_logprobs(lm, mb, device=cpu, autocast=ctx, shared_prefix=True)
    response_logprobs(lm, mb, device=cpu, autocast=ctx, shared_prefix=False)
    assert [m.ndim for m in lm.masks] == [4, 2]
    critic = _Recorder(lambda ids, kw: torch.zeros(ids.shape[0], kw["keep_last"]))
    response_values(critic, mb, device=cpu, autocast=ctx)
    rm = _Recorder(lambda ids, kw: torch.zeros(ids.shape[0]))
    sequence_rewards(rm, mb, device=cpu, autocast=ctx)
    assert [m.ndim for m in critic.masks + rm.masks] == [2, 2]
    cfg = LearnerConfig(critic={"enabled": True})
    assert [fed_4d_mask(cfg, r) for r in ("policy", "reference", "critic", "reward_model")] == [True, True, False,
                                                                                              False]


def _tiny_lm(attn: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)


@pytest.fixture
def probe_attention():
    """An attention function that records the dtype flash-attention 2 would compute in (the query's, or the one
    transformers' FA2 integration casts a float32 query to) and runs sdpa."""
    from transformers import AttentionInterface
    from transformers.integrations.flash_attention import get_target_dtype
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    seen: list[torch.dtype] = []

    def probe(module, query, key, value, attention_mask, **kw):
        seen.append(get_target_dtype(query, module) or query.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register("dtype_probe", probe)
    AttentionMaskInterface.register("dtype_probe", sdpa_mask)
    return seen


def test_attention_computes_in_the_compute_dtype_of_float32_weights(probe_attention):
    """What lets a float32-stored trained model take flash-attention 2: under the learner's bf16 compute, FSDP2
    mixed precision hands attention bfloat16 queries; under strategy 'none' (autocast) the queries come out of the
    rotary embedding in float32 and transformers' FA2 integration casts them to the autocast dtype."""
    from workers.learner.strategy import Fsdp2, PlainModule

    ids = torch.tensor([[1, 2, 3, 4]])
    pos = torch.arange(4)[None]
    plain = PlainModule(torch.device("cpu"), BF16)
    model = plain.wrap(_tiny_lm("dtype_probe"))
    assert next(model.parameters()).dtype == F32
    with plain.autocast():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=pos)
    model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=pos)   # float32 compute: float32
    assert probe_attention == [BF16, BF16, F32, F32]
    assert modeling.attention_for(LearnerConfig(strategy="none", dtype="bfloat16"), "reference")[0] == \
        plain.reference_dtype

    probe_attention.clear()
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        fsdp = Fsdp2(torch.device("cpu"), BF16, 1)
        model = fsdp.wrap(_tiny_lm("dtype_probe"))
        assert {p.dtype for p in model.parameters()} == {F32}   # the sharded master weights
        with fsdp.autocast():
            model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=pos)
        assert probe_attention == [BF16, BF16]
        assert modeling.attention_for(LearnerConfig(dtype="bfloat16"), "reference")[0] == fsdp.reference_dtype
    finally:
        dist.destroy_process_group()


def test_transformers_only_warns_for_flash_attention_on_float32_weights(monkeypatch):
    """The load-time check (transformers 5.19): flash-attention 2 asked for a float32 model warns, it does not
    refuse (``_flash_attn_can_dispatch``: "People often move dtypes after init so we only warn"). flash-attn's own
    availability check is faked away; what is checked is the dtype rule."""
    from transformers import PreTrainedModel

    model = _tiny_lm("sdpa")
    assert model.config.dtype == F32
    monkeypatch.setattr(PreTrainedModel, "_flash_attn_import_error", lambda self, *a, **kw: None)
    assert model._flash_attn_can_dispatch(flash_attn_version=2, is_init_check=True) is True
