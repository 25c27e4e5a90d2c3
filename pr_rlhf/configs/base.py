"""Config pieces shared by several sections of a recipe (engines, sampling, the scalar RM) and the strict base.

Pydantic only. Kept apart from :mod:`pr_rlhf.configs.recipe` so the section modules (``pr_rlhf.configs.reward``,
``pr_rlhf.rl``) can build on them while ``pr_rlhf.configs.recipe`` assembles the root recipe from all sections.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo in a recipe must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EngineConfig(StrictModel):
    """Which model answers, and through which backend."""

    backend: Literal["hf", "vllm", "openai"] = "hf"
    model: str = Field("tiny", description="'tiny' (built from a config, tokenizer trained locally), 'smollm2' "
                                           "(shipped SmolLM2-135M-Instruct), a local directory, or (openai / "
                                           "networked machines only) a served or hub model name")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    max_model_len: int = Field(2048, ge=16)
    seed: int = 0
    # local backends
    device: str = "cpu"
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)
    enable_prefix_caching: bool = True
    # openai backend
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str = Field("OPENAI_API_KEY", description="name of the environment variable holding the key "
                                                            "(the key itself never appears in a recipe or log)")
    concurrency: int = Field(8, ge=1)
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(3, ge=0)
    backoff_s: float = Field(0.5, ge=0)


class GenerationConfig(StrictModel):
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, ge=1)


class ScalarRMConfig(StrictModel):
    model: str = Field("tiny", description="'tiny' or a local sequence-classification checkpoint directory")
    max_length: int = Field(8192, ge=16, description="inputs are truncated to this many tokens (PRB: 8192)")
    batch_size: int = Field(8, ge=1)
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
