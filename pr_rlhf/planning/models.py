"""The model sizes `pr-rlhf plan` reads: a dense decoder's :class:`Arch` from its config.json, found by
:class:`Models` (the search order: the package docstring, :mod:`pr_rlhf.planning`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pr_rlhf.models.sources import TINY_COMMON, TINY_SIZES, TINY_VOCAB_SIZE

GIB = float(2 ** 30)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "auto": 2}   # auto: the configs below ship bfloat16


# Public config.json values (the fields the count reads) of the hub models recipes/gpu/*.yaml name, so that a
# machine without the weights plans them; SmolLM2 is the shipped 'smollm2'.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"},
    "Qwen/Qwen3-8B": {
        "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
        "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16"},
    "meta-llama/Llama-3.1-8B-Instruct": {
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False,
        "attention_bias": False, "torch_dtype": "bfloat16"},
    "HuggingFaceTB/SmolLM2-135M-Instruct": {
        "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
        "attention_bias": False, "torch_dtype": "bfloat16"},
}
ALIASES = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
           "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


class PlanError(ValueError):
    """Input the plan cannot use (a model config, a recipe with nothing to plan); the message names the file or
    field."""




@dataclass(frozen=True)
class Arch:
    """The sizes of a dense decoder, as its config.json gives them."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    source: str

    @property
    def layer_params(self) -> int:
        attn = (self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
                + self.heads * self.head_dim * self.hidden)
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return attn + bias + 3 * self.hidden * self.intermediate + norms

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    def params(self, head: str = "lm") -> int:
        """All parameters with an lm head (``"lm"``) or a scalar head (``"score"``: a reward model, a critic)."""
        body = self.embed_params + self.layers * self.layer_params + self.hidden
        if head == "score":
            return body + self.hidden
        return body + (0 if self.tied else self.embed_params)


def _int_field(cfg: dict, name: str, source: str, default: int | None = None) -> int:
    value = cfg.get(name, default)
    if value is None:
        raise PlanError(f"{source}: field {name!r} missing")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"{source}: field {name!r} must be a positive integer, got {value!r}")
    return value


def arch_from_config(cfg: Any, source: str) -> Arch:
    """The :class:`Arch` of a config.json mapping (a multimodal config's ``text_config`` when the top has no
    ``hidden_size``). ``source`` names the file in errors."""
    if not isinstance(cfg, dict):
        raise PlanError(f"{source}: a config.json must be a JSON object, got {type(cfg).__name__}")
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    for moe in ("num_experts", "num_local_experts", "n_routed_experts"):
        if cfg.get(moe):
            raise PlanError(f"{source}: field {moe!r}: mixture-of-experts models are not sized by the plan (it counts "
                            "dense decoders)")
    hidden = _int_field(cfg, "hidden_size", source)
    heads = _int_field(cfg, "num_attention_heads", source)
    model_type = str(cfg.get("model_type", ""))
    return Arch(hidden=hidden, layers=_int_field(cfg, "num_hidden_layers", source), heads=heads,
                kv_heads=_int_field(cfg, "num_key_value_heads", source, heads),
                head_dim=_int_field(cfg, "head_dim", source, hidden // heads),
                intermediate=_int_field(cfg, "intermediate_size", source), vocab=_int_field(cfg, "vocab_size", source),
                tied=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")), qk_norm=model_type == "qwen3",
                source=source)


def read_config_file(path: str | Path, what: str) -> Arch:
    """The :class:`Arch` of a config.json file (or a folder holding one); ``what`` names where it was given."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise PlanError(f"{what}: {p} not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{what}: {p} is not a readable JSON file: {exc}") from None
    return arch_from_config(cfg, str(p))


class Models:
    """Model spec -> :class:`Arch` (None: unknown), resolved once each; ``overrides``: spec -> config.json path."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self.found: dict[str, Arch | None] = {}

    def get(self, spec: str) -> Arch | None:
        if spec not in self.found:
            self.found[spec] = self._resolve(spec)
        return self.found[spec]

    def _resolve(self, spec: str) -> Arch | None:
        if spec in self.overrides:
            return read_config_file(self.overrides[spec], f"--model-config {spec}")
        base, _, extra = spec.partition(":")
        if base in TINY_SIZES:
            try:
                overrides = json.loads(extra) if extra else {}
            except json.JSONDecodeError as exc:
                raise PlanError(f"model {spec!r}: the overrides after ':' are not JSON: {exc}") from None
            cfg = {"model_type": "qwen2", "vocab_size": TINY_VOCAB_SIZE, **TINY_COMMON, **TINY_SIZES[base],
                   **overrides}
            return arch_from_config(cfg, f"tiny spec {spec!r} (pr_rlhf.models.sources)")
        if spec.lower() in ALIASES:
            hub = ALIASES[spec.lower()]
            return arch_from_config(KNOWN_CONFIGS[hub], f"built-in table of {hub}'s config.json")
        path = Path(spec).expanduser()
        if (path / "config.json").is_file():
            return read_config_file(path, f"model {spec}")
        if spec in KNOWN_CONFIGS:
            return arch_from_config(KNOWN_CONFIGS[spec], "built-in table of the hub's config.json")
        by_name = [hub for hub in KNOWN_CONFIGS if hub.rsplit("/", 1)[-1].lower() == path.name.lower()]
        if by_name:
            return arch_from_config(KNOWN_CONFIGS[by_name[0]], f"built-in table, by the folder's name ({by_name[0]})")
        return None

