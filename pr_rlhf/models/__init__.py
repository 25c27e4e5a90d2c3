"""Model backends: embedders (:mod:`pr_rlhf.models.embedders`), model sources (:mod:`pr_rlhf.models.sources`)
and generation engines behind one interface (:mod:`pr_rlhf.models.base`), built by :func:`make_engine`.

Kept import-light on purpose: torch, transformers, vllm and httpx load only when a backend is built.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pr_rlhf.models.base import Engine, Generation, Prompt, Sample, SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from pr_rlhf.configs.recipe import EngineConfig

__all__ = ["Engine", "Generation", "Prompt", "Sample", "SamplingParams", "make_engine", "resolve_model"]


def make_engine(cfg: EngineConfig) -> Engine:
    """The engine ``cfg.backend`` names: 'hf' (transformers), 'vllm' (offline vllm.LLM) or 'openai' (HTTP)."""
    if cfg.backend == "hf":
        from pr_rlhf.models.hf_engine import HFEngine

        return HFEngine.from_config(cfg)
    if cfg.backend == "vllm":
        from pr_rlhf.models.vllm_engine import VLLMEngine

        return VLLMEngine.from_config(cfg)
    if cfg.backend == "openai":
        from pr_rlhf.models.openai_engine import OpenAIEngine

        return OpenAIEngine.from_config(cfg)
    raise ValueError(f"unknown engine backend {cfg.backend!r}; expected 'hf', 'vllm' or 'openai'")


def resolve_model(spec: str) -> str:
    """See :func:`pr_rlhf.models.sources.resolve_model` (re-exported lazily: it imports nothing heavy itself)."""
    from pr_rlhf.models.sources import resolve_model as resolve

    return resolve(spec)
