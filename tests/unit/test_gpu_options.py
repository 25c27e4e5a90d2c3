"""GPU-only options decided on CPU: the attention kernel the learner loads, and the GPU share of a rank."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.rl.modeling import pick_attn_implementation


def test_attention_kernel_choice(monkeypatch):
    from pr_rlhf.rl import modeling

    real = importlib.util.find_spec
    monkeypatch.setattr(modeling, "flash_attn_available", lambda: True)   # installed and importable
    assert pick_attn_implementation("auto", "cuda", torch.bfloat16) == "flash_attention_2"
    assert pick_attn_implementation("auto", "cuda", torch.float32) == "sdpa"      # flash-attn is 16-bit only
    assert pick_attn_implementation("auto", "cpu", torch.bfloat16) == "sdpa"
    assert pick_attn_implementation("eager", "cuda", torch.bfloat16) == "eager"   # an explicit choice stands
    monkeypatch.undo()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn"
                        else real(name, *a))
    assert pick_attn_implementation("auto", "cuda", torch.bfloat16) == "sdpa"     # not installed


def test_gpu_share_per_rank():
    assert LearnerConfig(num_gpus_per_worker=0.5).num_gpus_per_worker == 0.5
    with pytest.raises(ValueError):
        LearnerConfig(num_gpus_per_worker=2)
