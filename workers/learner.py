"""The learner: policy / reference / critic training on Ray, one actor per FSDP2 rank.

``LearnerWorker`` is one data-parallel rank (a plain class; ``LearnerGroup`` runs it as a Ray actor). It owns

- the **policy** (HF causal LM, trained with AdamW),
- a frozen **reference** copy of the initial policy (built eagerly when ``kl.coef > 0``, else on the first
  ``compute_ref_logprobs``), sharded like the policy,
- optionally a **critic** (the policy's backbone, a copy of the initial weights, with a scalar value head) for PPO.

With strategy ``fsdp2`` every model is sharded with ``torch.distributed.fsdp.fully_shard`` (per decoder layer, then
the root) over a 1-D device mesh: gloo on CPU, nccl on GPU. ``none`` is a plain module (one rank), ``deepspeed``
wraps the policy and critic in ZeRO engines (only when the package is installed; not exercised by the tests here).

``LearnerGroup`` creates ``world_size`` actors in a placement group, wires ``MASTER_ADDR`` / ``MASTER_PORT`` /
``RANK`` / ``WORLD_SIZE``, splits every batch across the ranks by sample and gathers the results.

Batch format (a dict; what the controller sends)
================================================

Required by every method:

``prompt_ids``      ragged ``list[list[int]]`` (or 1-D tensors), or a LongTensor ``[B, P]`` with ``prompt_mask``
                    ``[B, P]`` (1 on real tokens; any padding side). Every prompt needs at least one token.
``response_ids``    ragged ``list[list[int]]``, or a LongTensor ``[B, T]`` right-padded with ``response_mask``.
``response_mask``   optional (default: every response token). 1 on the response tokens that count in the losses;
                    a 0 keeps the token in the context but out of the losses (e.g. tool output in a multi-turn
                    rollout). Ragged input: a ragged mask, the response is its full list. Tensor input: the
                    response ends at the last 1 of its mask, unless ``response_attention_mask`` ``[B, T]`` (1 on
                    every present token) says otherwise.

Per-token fields (ragged lists of per-response-token floats, or ``[B, T]`` tensors aligned with
``response_ids``' columns):

``old_logprobs``    ``update_policy`` (required): log-probs of the behaviour policy (``compute_logprobs``).
``advantages``      ``update_policy`` (required); a ``[B]`` tensor / list of floats is broadcast over each response.
``ref_logprobs``    ``update_policy`` when ``kl.where == 'loss'`` and ``kl.coef > 0`` (computed here if absent).
``values``          ``update_critic`` (required): the critic's values at rollout time (``compute_values``).
``returns``         ``update_critic`` (required).

Outputs of ``compute_logprobs`` / ``compute_ref_logprobs`` / ``compute_values`` are float32 ``[B, T]`` CPU
tensors, right-padded like the input responses (the width of a tensor input is kept; ragged input gives
``T = max response length``), 0 after each response. ``logprob[i, t] = log pi(response[i, t] | prompt_i +
response[i, :t])`` (logits divided by ``temperature``); ``values[i, t] = V(prompt_i + response[i, :t])``.

Updates
=======

``update_policy`` / ``update_critic`` run ``ppo_epochs`` passes over the mini-batches (``mini_batch_size`` global
samples, in batch order; ``LearnerGroup`` splits each one across the ranks), one AdamW step per mini-batch, with
gradients accumulated over micro-batches. Each micro-batch loss is normalized by the *global* mini-batch token
(or sequence) count times the number of ranks (``pr_rlhf.algos.GlobalBatchInfo``), so a step is the same whatever
the world size or micro-batch size. A rank with fewer micro-batches runs zero-weight stand-ins so every FSDP
collective is matched. Gradients are clipped with ``clip_grad_norm_``; a step with a non-finite norm is skipped.

Checkpoints (``save_checkpoint(dir, step, data_position)``)
===========================================================

``dir/policy/``: ``model.safetensors`` (full weights; tied tensors once) + the model's config and tokenizer files,
i.e. an HF model directory, and ``optimizer.pt`` (the full AdamW state keyed by parameter name, tensors and
numbers only: ``torch.load(..., weights_only=True)``); ``dir/critic/`` likewise (weights + optimizer);
``dir/rng/rank_<r>.pt`` (torch / numpy / python ``random`` / CUDA RNG states); ``dir/meta.json`` written last
(step, data_position, world size, counters, config): a folder without it is incomplete. Full (unsharded) state
dicts make a checkpoint loadable at any world size. Same seed + same data => bitwise the same weights (CPU).
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from pr_rlhf.configs.learner import LearnerConfig
from workers.ray_utils import release_bundles, reserve_bundles

if TYPE_CHECKING:  # pragma: no cover
    from typing import Self

log = logging.getLogger(__name__)

PER_TOKEN_FIELDS = ("old_logprobs", "ref_logprobs", "advantages", "values", "returns")
SEQUENCE_BROADCAST_FIELDS = ("advantages",)  # may be given per sequence ([B]) and broadcast over the response
CANONICAL_KEYS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "response_attention_mask")
CHECKPOINT_FORMAT = "pr_rlhf-learner-v1"
_META = "meta.json"


class DeepSpeedUnavailable(ImportError):
    """strategy 'deepspeed' was asked for but the package is not installed."""


# =================================================================================================================
# Batches
# =================================================================================================================

def _rows(value: Any) -> list[list[Any]]:
    if isinstance(value, torch.Tensor):
        if value.dim() != 2:
            raise ValueError(f"expected a 2-D tensor, got shape {tuple(value.shape)}")
        return value.tolist()
    return [list(r.tolist()) if isinstance(r, torch.Tensor) else list(r) for r in value]


def _pad_ragged(rows: list[list[Any]], width: int, left: bool, fill: Any, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            if len(row) > width:
                raise ValueError(f"row {i}: {len(row)} values do not fit width {width}")
            values = torch.as_tensor(row, dtype=dtype)
            if left:
                out[i, width - len(row):] = values
            else:
                out[i, :len(row)] = values
    return out


def collate(batch: Mapping[str, Any], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Normalize a batch (see the module docstring) to the canonical padded layout used by the workers:

    ``prompt_ids`` / ``prompt_mask`` ``[B, P]`` left-padded; ``response_ids`` / ``response_attention_mask`` /
    ``response_mask`` ``[B, T]`` right-padded (attention: every token of the response, loss: ``response_mask``);
    per-token fields ``[B, T]`` float32 (0 on padding); ``minibatch_index`` ``[B]`` passes through.
    Tensor inputs keep their width (P, T); ragged inputs are padded to the longest row. Idempotent.
    """
    if "prompt_ids" not in batch or "response_ids" not in batch:
        raise KeyError(f"a learner batch needs 'prompt_ids' and 'response_ids'; got keys {sorted(batch)}")
    # ---- prompts: keep the masked tokens in order, left-padded
    p_in = batch["prompt_ids"]
    if isinstance(p_in, torch.Tensor):
        if p_in.dim() != 2:
            raise ValueError(f"prompt_ids: expected [B, P], got shape {tuple(p_in.shape)}")
        p_mask = batch.get("prompt_mask")
        p_mask = torch.ones_like(p_in) if p_mask is None else torch.as_tensor(p_mask).to(torch.long).ne(0).long()
        order = torch.sort(p_mask, dim=1, stable=True).indices  # pads first, tokens keep their order
        prompt_mask = p_mask.gather(1, order)
        prompt_ids = torch.where(prompt_mask.bool(), p_in.long().gather(1, order), pad_token_id)
    else:
        rows = _rows(p_in)
        width = max((len(r) for r in rows), default=1)
        prompt_ids = _pad_ragged(rows, width, True, pad_token_id, torch.long)
        prompt_mask = _pad_ragged([[1] * len(r) for r in rows], width, True, 0, torch.long)
    n = prompt_ids.shape[0]
    if n and bool((prompt_mask.sum(-1) == 0).any()):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from the "
                         "last prompt token)")
    # ---- responses: right-padded; a response extends to the last 1 of its mask (or of response_attention_mask)
    r_in = batch["response_ids"]
    r_mask_in = batch.get("response_mask")
    if isinstance(r_in, torch.Tensor):
        if r_in.dim() != 2:
            raise ValueError(f"response_ids: expected [B, T], got shape {tuple(r_in.shape)}")
        width_t = max(int(r_in.shape[1]), 1)
        r_ids = torch.nn.functional.pad(r_in.long(), (0, width_t - r_in.shape[1]), value=pad_token_id)
        r_mask = torch.ones_like(r_ids, dtype=torch.float32) if r_mask_in is None else \
            torch.nn.functional.pad(torch.as_tensor(r_mask_in).ne(0).float(), (0, width_t - r_in.shape[1]))
        presence = r_mask  # a padded tensor: the response ends at the last 1 of its mask
    else:
        rows = _rows(r_in)
        width_t = max(max((len(r) for r in rows), default=0), 1)
        r_ids = _pad_ragged(rows, width_t, False, pad_token_id, torch.long)
        r_mask = _pad_ragged([[1.0] * len(r) for r in rows], width_t, False, 0.0, torch.float32) \
            if r_mask_in is None else _pad_ragged([[float(bool(m)) for m in r] for r in _rows(r_mask_in)],
                                                  width_t, False, 0.0, torch.float32)
        presence = _pad_ragged([[1.0] * len(r) for r in rows], width_t, False, 0.0, torch.float32)
    if r_ids.shape[0] != n:
        raise ValueError(f"prompt_ids has {n} rows but response_ids has {r_ids.shape[0]}")
    attn_in = batch.get("response_attention_mask")
    presence = presence if attn_in is None else (
        torch.as_tensor(attn_in) if isinstance(attn_in, torch.Tensor) else
        _pad_ragged(_rows(attn_in), width_t, False, 0, torch.long)).ne(0).float()
    positions = torch.arange(1, width_t + 1)
    lengths = (presence[:, :width_t] * positions).amax(-1).long() if n else torch.zeros(0, dtype=torch.long)
    response_attn = (positions[None, :] <= lengths[:, None]).long()
    out = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
           "response_ids": torch.where(response_attn.bool(), r_ids, pad_token_id),
           "response_attention_mask": response_attn, "response_mask": r_mask * response_attn}
    # ---- per-token fields, aligned with the response columns
    for name in PER_TOKEN_FIELDS:
        value = batch.get(name)
        if value is None:
            continue
        if name in SEQUENCE_BROADCAST_FIELDS and _is_per_sequence(value, n):
            dense = torch.as_tensor(value, dtype=torch.float32).reshape(n)[:, None].expand(n, width_t)
        elif isinstance(value, torch.Tensor):
            if value.dim() != 2 or value.shape[0] != n:
                raise ValueError(f"{name}: expected [{n}, T], got shape {tuple(value.shape)}")
            dense = torch.nn.functional.pad(value.float(), (0, max(0, width_t - value.shape[1])))[:, :width_t]
            if n and value.shape[1] < int(lengths.max()):
                raise ValueError(f"{name} has {value.shape[1]} columns for responses of up to {int(lengths.max())}")
        else:
            rows = _rows(value)
            if len(rows) != n:
                raise ValueError(f"{name} has {len(rows)} rows, the batch has {n}")
            short = [i for i, row in enumerate(rows) if len(row) < int(lengths[i])]
            if short:
                i = short[0]
                raise ValueError(f"{name} row {i} has {len(rows[i])} values for a {int(lengths[i])}-token response")
            dense = _pad_ragged([row[:int(k)] for row, k in zip(rows, lengths)], width_t, False, 0.0, torch.float32)
        out[name] = (dense * response_attn).contiguous()
    if "minibatch_index" in batch:
        out["minibatch_index"] = torch.as_tensor(batch["minibatch_index"], dtype=torch.long).reshape(n)
    return out


def _is_per_sequence(value: Any, n: int) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 1
    return len(value) == n and all(isinstance(v, (int, float)) for v in value)


def batch_size(batch: Mapping[str, Any]) -> int:
    ids = batch["prompt_ids"]
    return int(ids.shape[0]) if isinstance(ids, torch.Tensor) else len(ids)


def take_rows(batch: Mapping[str, torch.Tensor], rows: Any) -> dict[str, torch.Tensor]:
    """Rows ``rows`` of a canonical batch (every value is a tensor with the batch as its first dimension)."""
    idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    return {k: v.index_select(0, idx) for k, v in batch.items()}


# =================================================================================================================
# Models
# =================================================================================================================

class CriticModel(nn.Module):
    """A value model: an HF decoder backbone (``AutoModel``) with a linear scalar head on every position."""

    def __init__(self, backbone: nn.Module, hidden_size: int, init_std: float) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=init_std)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                keep_last: int) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False).last_hidden_state
        hidden = hidden[:, -keep_last:]
        # a fresh tensor, not a view: FSDP2 hooks the module output for backward
        return self.value_head(hidden.to(self.value_head.weight.dtype))[..., 0].clone()


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _no_dropout(module: nn.Module) -> None:
    """On-policy PPO needs log-probs that do not depend on train / eval mode."""
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


def _layer_classes(model: nn.Module) -> tuple[type, ...]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(f"{type(model).__name__}: cannot find its decoder layers (_no_split_modules={names})")
    return tuple(classes)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# =================================================================================================================
# Checkpoint helpers
# =================================================================================================================

def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
        "numpy_pos": int(np_state[2]), "numpy_has_gauss": int(np_state[3]),
        "numpy_cached_gaussian": float(np_state[4]),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), int(state["numpy_pos"]),
                         int(state["numpy_has_gauss"]), float(state["numpy_cached_gaussian"])))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _save_safetensors(state: Mapping[str, torch.Tensor], path: Path) -> None:
    """Save a state dict, writing each shared (tied) tensor once: HF loaders re-tie the skipped keys and
    ``_load_safetensors`` restores them from the ``aliases`` metadata."""
    from safetensors.torch import save_file

    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = tensor.detach().contiguous()
    save_file(tensors, str(path), metadata={"format": "pt", "aliases": json.dumps(aliases)})


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    state = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
    for name, source in aliases.items():
        state[name] = state[source]
    return state


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# =================================================================================================================
# The worker
# =================================================================================================================

@dataclass
class _UpdateLog:
    """What one update call accumulates on this rank: token-weighted stat sums, loss sums, step outcomes."""

    losses: dict[str, float]
    epochs: int = 1                                    # passes over the data (num_tokens is per pass)
    sums: dict[str, float] = field(default_factory=dict)
    norms: list[float] = field(default_factory=list)
    post_norms: list[float] = field(default_factory=list)
    steps: int = 0
    skipped: int = 0

    def add_token_stats(self, mask: torch.Tensor, per_token_means: Mapping[str, Any], **token_sums: float) -> None:
        """Stats that are means over the micro-batch's tokens (weighted by its token count) and plain sums."""
        w = float(mask.sum())
        for k, v in per_token_means.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * w
        for k, v in token_sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.sums["_tokens"] = self.sums.get("_tokens", 0.0) + w

    def record_step(self, norm: float, post: float, stepped: bool) -> None:
        self.norms.append(norm)
        self.post_norms.append(post)
        self.steps += int(stepped)
        self.skipped += int(not stepped)


def pick_attn_implementation(requested: str, device_type: str, dtype: Any) -> str:
    """The attention kernel to load a model with: ``requested`` unless "auto"; "auto" takes flash_attention_2 on
    CUDA in 16-bit when flash-attn is importable (it supports nothing else), otherwise sdpa."""
    if requested != "auto":
        return requested
    if device_type == "cuda" and str(dtype).endswith(("bfloat16", "float16")):
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


class LearnerWorker:
    """One learner rank. Use through ``LearnerGroup`` (Ray); a single-rank worker also runs in-process:
    ``w = LearnerWorker(cfg); w.setup()``.

    Every public method that touches a model is collective: with ``world_size > 1`` all ranks must call it together
    (``LearnerGroup`` does), each with its own share of the batch (any size, also empty).
    """

    def __init__(self, config: LearnerConfig | Mapping[str, Any], rank: int = 0) -> None:
        self.config = config if isinstance(config, LearnerConfig) else LearnerConfig.model_validate(config)
        self.rank = rank
        self.world_size = self.config.world_size
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world_size {self.world_size}")
        self._ready = False
        self.policy: nn.Module | None = None
        self.ref: nn.Module | None = None
        self.critic: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self.optimizer_steps = 0
        self.critic_optimizer_steps = 0
        self.ref_rebased = False     # True once rebase_reference() made the reference a copy of the policy
        self._owns_process_group = False
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)

    # ------------------------------------------------------------------------------------------------- setup
    def node_endpoint(self) -> tuple[str, int, str]:
        """(this node's IP, a free port, the Ray node id): rank 0 offers the first two as MASTER_ADDR / PORT."""
        from workers.ray_utils import current_node_id

        node = current_node_id()   # "local" outside Ray (asking Ray's runtime context would start a Ray)
        if node == "local":
            return "127.0.0.1", _free_port(), node
        import ray

        return ray.util.get_node_ip_address(), _free_port(), node

    def setup(self, master_addr: str | None = None, master_port: int | None = None) -> dict[str, Any]:
        """Join the process group, load the models, build the optimizers. Returns a short description."""
        if self._ready:
            return self.describe()
        t0 = time.perf_counter()
        cfg = self.config
        if cfg.strategy == "deepspeed":
            try:
                import deepspeed  # noqa: F401
            except ImportError as exc:
                raise DeepSpeedUnavailable(
                    "strategy 'deepspeed' needs the deepspeed package (CPU: DS_BUILD_OPS=0 pip install deepspeed; "
                    "GPU: the 'gpu' extra); it is not installed. Use strategy 'fsdp2'.") from exc
        os.environ["MASTER_ADDR"] = master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
        # a lone rank outside a group takes a fresh port (a stale MASTER_PORT in the environment may be taken)
        inherited = os.environ.get("MASTER_PORT") if self.world_size > 1 else None
        os.environ["MASTER_PORT"] = str(master_port or inherited or _free_port())
        os.environ["RANK"] = str(self.rank)
        os.environ["WORLD_SIZE"] = str(self.world_size)
        os.environ.setdefault("LOCAL_RANK", "0")
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        if use_cuda and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was asked for but this worker sees no GPU")
        self.device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
        if not dist.is_initialized():
            dist.init_process_group("nccl" if use_cuda else "gloo", rank=self.rank, world_size=self.world_size)
            self._owns_process_group = True
        elif dist.get_world_size() != self.world_size:
            raise RuntimeError(f"a process group of size {dist.get_world_size()} already exists; this learner "
                               f"needs {self.world_size}")
        self.mesh = None
        if cfg.strategy == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(self.device.type, (self.world_size,))

        from pr_rlhf.models.sources import quiet_hf_loading, resolve_model

        quiet_hf_loading()
        self.model_dir = resolve_model(cfg.model)
        self.compute_dtype = _torch_dtype(cfg.dtype)
        _seed_everything(cfg.seed)  # identical initialization (critic head) on every rank
        self.policy = self._wrap(self._load_causal_lm(torch.float32, trainable=True))
        self.pad_token_id = int(getattr(self._hf_config, "pad_token_id", None) or 0)
        self.optimizer = self._build_optimizer(self.policy, cfg.lr, cfg.weight_decay)
        if cfg.needs_reference:
            self._build_reference()
        if cfg.critic.enabled:
            self.critic = self._wrap(self._load_critic())
            self.critic_optimizer = self._build_optimizer(self.critic, cfg.critic.lr, cfg.critic.weight_decay)
        if cfg.strategy == "deepspeed":
            self._init_deepspeed()
        _seed_everything(cfg.seed + self.rank)  # per-rank streams from here on
        self._loss_fn_name = cfg.policy_loss
        from pr_rlhf.algos import POLICY_LOSSES

        POLICY_LOSSES.get(cfg.policy_loss)  # unknown names fail at setup, not at the first update
        self._barrier()
        self._ready = True
        self.setup_time_s = time.perf_counter() - t0
        return self.describe()

    def describe(self) -> dict[str, Any]:
        n_params = sum(p.numel() for p in self.policy.parameters()) if self.policy is not None else 0
        return {"rank": self.rank, "world_size": self.world_size, "strategy": self.config.strategy,
                "device": str(self.device), "backend": dist.get_backend() if dist.is_initialized() else None,
                "model_dir": self.model_dir, "local_policy_params": int(n_params),
                "reference": self.ref is not None, "critic": self.critic is not None,
                "optimizer_steps": self.optimizer_steps, "setup_time_s": getattr(self, "setup_time_s", None),
                "pid": os.getpid(), "node_id": self.node_endpoint()[2]}

    def _attn(self, dtype: torch.dtype) -> str:
        return pick_attn_implementation(self.config.attn_implementation, self.device.type, dtype)

    def _load_causal_lm(self, dtype: torch.dtype, trainable: bool) -> nn.Module:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype, attn_implementation=self._attn(dtype))
        self._hf_config = model.config
        _no_dropout(model)
        if trainable:
            if self.config.gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.train()
        else:
            model.eval().requires_grad_(False)
        return model

    def _load_critic(self) -> nn.Module:
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(self.model_dir, dtype=torch.float32,
                                             attn_implementation=self._attn(torch.float32))
        _no_dropout(backbone)
        if self.config.gradient_checkpointing:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        critic = CriticModel(backbone, backbone.config.hidden_size,
                             float(getattr(backbone.config, "initializer_range", 0.02)))
        critic._no_split_modules = backbone._no_split_modules  # type: ignore[attr-defined]
        return critic.train()

    def _wrap(self, model: nn.Module, frozen: bool = False) -> nn.Module:
        """Shard (fsdp2) or place (none / deepspeed: the engine is built later) a freshly loaded model."""
        if self.config.strategy != "fsdp2":
            return model.to(self.device)
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy()
        if not frozen and self.compute_dtype != torch.float32:
            mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        layer_types = _layer_classes(model)
        for module in model.modules():
            if isinstance(module, layer_types):
                fully_shard(module, mesh=self.mesh, mp_policy=mp)
        fully_shard(model, mesh=self.mesh, mp_policy=mp)
        return model

    def _build_reference(self) -> None:
        cfg = self.config
        dtype = self.compute_dtype if cfg.strategy == "fsdp2" else torch.float32
        ref = self._load_causal_lm(dtype, trainable=False)
        if cfg.strategy == "fsdp2":
            self.ref = self._wrap(ref, frozen=True)
        else:
            self.ref = ref.to(self.device)

    def _build_optimizer(self, model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, betas=tuple(self.config.betas), eps=self.config.eps,
                                 weight_decay=weight_decay)

    def _init_deepspeed(self) -> None:  # pragma: no cover - needs the deepspeed package
        import deepspeed

        cfg = self.config

        def ds_config(micro: int, clip: float | None) -> dict[str, Any]:
            return {
                "train_micro_batch_size_per_gpu": micro,
                "gradient_accumulation_steps": 1,  # boundaries are set by hand (set_gradient_accumulation_boundary)
                "zero_optimization": {"stage": cfg.zero_stage},
                "bf16": {"enabled": cfg.dtype == "bfloat16"},
                "fp16": {"enabled": cfg.dtype == "float16"},
                "gradient_clipping": float(clip or 0.0),
                "steps_per_print": 2**31 - 1,
                "wall_clock_breakdown": False,
            }

        self.policy, self.optimizer, _, _ = deepspeed.initialize(
            model=self.policy, optimizer=self.optimizer, config=ds_config(cfg.micro_batch_size, cfg.grad_clip),
            dist_init_required=False)
        if self.critic is not None:
            self.critic, self.critic_optimizer, _, _ = deepspeed.initialize(
                model=self.critic, optimizer=self.critic_optimizer,
                config=ds_config(cfg.critic.micro_batch_size or cfg.micro_batch_size, cfg.grad_clip),
                dist_init_required=False)

    def _require_ready(self) -> None:
        if not self._ready:
            raise RuntimeError("LearnerWorker.setup() has not run")

    # ------------------------------------------------------------------------------------------- collectives
    @property
    def _distributed(self) -> bool:
        return self.world_size > 1 and dist.is_initialized()

    def _barrier(self) -> None:
        if self._distributed:
            dist.barrier()

    def _reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        if not self._distributed:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t.tolist()

    def _autocast(self):
        # fsdp2 / deepspeed cast parameters themselves; a plain module in low precision uses autocast
        if self.config.strategy == "none" and self.compute_dtype != torch.float32:
            return torch.autocast(self.device.type, dtype=self.compute_dtype)
        return nullcontext()

    # ------------------------------------------------------------------------------------------------ forward
    def _inputs(self, mb: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        input_ids = torch.cat([mb["prompt_ids"], mb["response_ids"]], dim=1).to(self.device)
        attention = torch.cat([mb["prompt_mask"], mb["response_attention_mask"]], dim=1).to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        return input_ids, attention, positions, mb["response_ids"].shape[1]

    def _policy_forward(self, model: nn.Module, mb: Mapping[str, torch.Tensor], with_entropy: bool,
                        entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs ``[b, T]`` (float32) of the response tokens, and optionally their entropies."""
        from pr_rlhf.algos import entropy_from_logits

        packed = None
        if self.config.shared_prefix:
            from pr_rlhf.rl.packing import pack_shared_prefix

            packed = pack_shared_prefix(mb["prompt_ids"], mb["prompt_mask"], mb["response_ids"],
                                        mb["response_attention_mask"], self.pad_token_id)
        if packed is not None:  # a group's prompt once, its responses after it (exactly the same log-probs)
            with self._autocast():
                out = model(input_ids=packed.input_ids.to(self.device),
                            attention_mask=packed.attention_mask.to(self.device),
                            position_ids=packed.position_ids.to(self.device), use_cache=False)
            logits = out.logits[packed.gather_group.to(self.device), packed.gather_pos.to(self.device)].float()
        else:
            input_ids, attention, positions, t = self._inputs(mb)
            with self._autocast():
                out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=False,
                            logits_to_keep=t + 1)
            logits = out.logits[:, :-1].float()
        if self.config.temperature != 1.0:
            logits = logits / self.config.temperature
        targets = mb["response_ids"].to(self.device)
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        entropy = None
        if with_entropy:
            with torch.no_grad() if not entropy_grad else nullcontext():
                entropy = entropy_from_logits(logits)
        return logp, entropy

    def _critic_forward(self, model: nn.Module, mb: Mapping[str, torch.Tensor]) -> torch.Tensor:
        input_ids, attention, positions, t = self._inputs(mb)
        with self._autocast():
            values = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, keep_last=t + 1)
        return values[:, :-1].float()

    def _dummy_micro_batch(self) -> dict[str, torch.Tensor]:
        """A one-token stand-in so that a rank with fewer samples still joins every FSDP collective."""
        one = torch.full((1, 1), self.pad_token_id, dtype=torch.long)
        return {"prompt_ids": one, "prompt_mask": torch.ones_like(one), "response_ids": one.clone(),
                "response_attention_mask": torch.ones_like(one), "response_mask": torch.zeros(1, 1)}

    def _micro_batches(self, rows: torch.Tensor, size: int) -> int:
        """Number of micro-batches every rank runs for its ``rows`` (the max over ranks)."""
        return int(self._reduce([math.ceil(len(rows) / size)], op="max")[0])

    @torch.no_grad()
    def _forward_all(self, model: nn.Module, batch: Mapping[str, torch.Tensor], fn) -> torch.Tensor:
        size = self.config.forward_micro_batch_size or self.config.micro_batch_size
        n, t = batch["response_ids"].shape
        rows = torch.arange(n)
        out = torch.zeros((n, t), dtype=torch.float32)
        was_training = model.training
        model.eval()
        try:
            for j in range(self._micro_batches(rows, size)):
                chunk = rows[j * size:(j + 1) * size]
                if len(chunk) == 0:
                    fn(model, self._dummy_micro_batch())
                    continue
                mb = take_rows(batch, chunk)
                out[chunk] = fn(model, mb).cpu() * mb["response_attention_mask"]
        finally:
            model.train(was_training)
            self._reshard(model)
        return out

    def _reshard(self, model: nn.Module) -> None:
        """Free FSDP2's unsharded parameters. The root module keeps them after a forward without backward (its
        reshard_after_forward defaults to False); state-dict loading and memory both want them sharded."""
        if self.config.strategy != "fsdp2":
            return
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()

    def _canonical(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        return collate(batch, pad_token_id=self.pad_token_id)

    def compute_logprobs(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Per-token log-probs ``[B, T]`` of the responses under the current policy."""
        self._require_ready()
        b = self._canonical(batch)
        return self._forward_all(self.policy, b, lambda m, mb: self._policy_forward(m, mb, False)[0])

    def compute_ref_logprobs(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Per-token log-probs ``[B, T]`` under the frozen reference (the initial policy)."""
        self._require_ready()
        if self.ref is None:
            self._build_reference()
        b = self._canonical(batch)
        return self._forward_all(self.ref, b, lambda m, mb: self._policy_forward(m, mb, False)[0])

    def compute_values(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Critic values ``[B, T]``: ``values[i, t]`` = V(prompt_i + response_i[:t])."""
        self._require_ready()
        if self.critic is None:
            raise RuntimeError("the critic is disabled (critic.enabled: false)")
        b = self._canonical(batch)
        return self._forward_all(self.critic, b, self._critic_forward)

    # ------------------------------------------------------------------------------------------------ updates
    def _mini_batches(self, b: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """Row indices of each mini-batch; the same count on every rank (possibly empty on some)."""
        n = b["response_ids"].shape[0]
        if "minibatch_index" in b:
            index = b["minibatch_index"]
        else:
            size = self.config.mini_batch_size
            local = n if size is None else max(1, math.ceil(size / self.world_size))
            index = torch.arange(n) // max(local, 1)
        count = int(self._reduce([int(index.max()) + 1 if n else 0], op="max")[0])
        return [torch.nonzero(index == k).flatten() for k in range(count)]

    def _global_batch_info(self, mask: torch.Tensor):
        from pr_rlhf.algos import GlobalBatchInfo

        tokens, seqs = self._reduce([float(mask.sum()), float((mask.sum(-1) > 0).sum())])
        # gradients are averaged over the ranks (FSDP2 reduce-scatter, DeepSpeed allreduce): dp_size undoes that
        return GlobalBatchInfo(dp_size=self.world_size, num_tokens=tokens, num_seqs=seqs), tokens, seqs

    def _set_sync(self, model: nn.Module, sync: bool) -> None:
        if self.config.strategy == "fsdp2" and self.world_size > 1:
            model.set_requires_gradient_sync(sync)

    def _backward(self, model: nn.Module, loss: torch.Tensor, last: bool) -> None:
        if self.config.strategy == "deepspeed":  # pragma: no cover
            model.set_gradient_accumulation_boundary(last)
            model.backward(loss, scale_wrt_gas=False)
        else:
            loss.backward()

    def _step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[float, float, bool]:
        """Clip and step. Returns (grad norm before clipping, after clipping, stepped)."""
        if self.config.strategy == "deepspeed":  # pragma: no cover
            model.step()
            norm = float(model.get_global_grad_norm() or 0.0)
            clip = self.config.grad_clip
            return norm, min(norm, clip) if clip else norm, True
        params = [p for p in model.parameters() if p.requires_grad]
        max_norm = self.config.grad_clip if self.config.grad_clip is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if not math.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            return norm, norm, False
        post = torch.nn.utils.clip_grad_norm_(params, float("inf"))
        post = float(post.full_tensor() if hasattr(post, "full_tensor") else post)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm, post, True

    def _zero_grad(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.config.strategy != "deepspeed":
            optimizer.zero_grad(set_to_none=True)

    def _accumulated_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, b: Mapping[str, torch.Tensor],
                          rows: torch.Tensor, size: int, log: _UpdateLog,
                          micro_loss: Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor],
                          idle_output: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> None:
        """One optimizer step over ``rows`` in micro-batches of ``size``: gradients accumulate, ranks synchronize
        on the last micro-batch. ``micro_loss(mb, mask)`` is the loss of a micro-batch with response tokens (it
        may record stats in ``log``); a rank with fewer rows, or only masked ones, backpropagates zero times
        ``idle_output`` of a stand-in so that every FSDP collective is matched."""
        self._zero_grad(model, optimizer)
        n_micro = self._micro_batches(rows, size)
        for j in range(n_micro):
            chunk = rows[j * size:(j + 1) * size]
            last = j == n_micro - 1
            self._set_sync(model, last)
            mb = take_rows(b, chunk) if len(chunk) else None
            if mb is None or float(mb["response_mask"].sum()) == 0:
                self._backward(model, idle_output(mb or self._dummy_micro_batch()).sum() * 0.0, last)
                continue
            self._backward(model, micro_loss(mb, mb["response_mask"].to(self.device)), last)
        log.record_step(*self._step(model, optimizer))
        self._set_sync(model, True)

    def update_policy(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """PPO / GRPO policy update: ``ppo_epochs`` passes over the mini-batches, one AdamW step each.

        Needs ``old_logprobs`` and ``advantages`` (and ``ref_logprobs`` when the KL is in the loss; computed here
        if absent). Returns global metrics (identical on every rank), keys prefixed ``actor/``.
        """
        self._require_ready()
        from pr_rlhf.algos import POLICY_LOSSES, agg_loss, kl_penalty

        cfg = self.config
        t0 = time.perf_counter()
        b = self._canonical(batch)
        if "advantages" not in b:
            raise KeyError(f"update_policy needs 'advantages' in the batch (have {sorted(b)})")
        if cfg.kl_in_loss and "ref_logprobs" not in b:
            b["ref_logprobs"] = self.compute_ref_logprobs(b)
        minis = self._mini_batches(b)
        # On-policy shortcut (as TRL does): with one epoch over one mini-batch the policy being updated *is* the
        # behaviour policy, so the old log-probs are this forward's own, detached; no separate pass is needed.
        on_policy = "old_logprobs" not in b
        if on_policy and not (cfg.ppo_epochs == 1 and len(minis) <= 1):
            raise KeyError(f"update_policy needs 'old_logprobs' in the batch (have {sorted(b)}): without them only "
                           f"a single on-policy update (ppo_epochs 1, one mini-batch) is possible")
        log = _UpdateLog({"pg_loss": 0.0, "kl_loss": 0.0, "entropy_loss": 0.0}, epochs=cfg.ppo_epochs)
        self.policy.train()
        for _epoch in range(cfg.ppo_epochs):
            for rows in minis:
                gb, g_tokens, g_seqs = self._global_batch_info(b["response_mask"][rows])
                if (g_seqs if cfg.loss_agg_mode.startswith("seq") else g_tokens) == 0:
                    continue  # nothing to learn from anywhere: every rank skips together

                def micro_loss(mb: dict[str, torch.Tensor], mask: torch.Tensor, gb=gb) -> torch.Tensor:
                    logp, entropy = self._policy_forward(self.policy, mb, True, entropy_grad=cfg.entropy_coef > 0)
                    old = logp.detach() if on_policy else mb["old_logprobs"].to(self.device)
                    pg_loss, stats = POLICY_LOSSES.call(
                        cfg.policy_loss, old, logp, mb["advantages"].to(self.device),
                        mask, clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                        clip_ratio_c=cfg.clip_ratio_c, agg_mode=cfg.loss_agg_mode, global_batch=gb)
                    loss = pg_loss
                    log.losses["pg_loss"] += float(pg_loss.detach())
                    if cfg.entropy_coef > 0:
                        ent_loss = agg_loss(entropy, mask, cfg.loss_agg_mode, global_batch=gb)
                        loss = loss - cfg.entropy_coef * ent_loss
                        log.losses["entropy_loss"] += float(ent_loss.detach())
                    if cfg.kl_in_loss:
                        kld = kl_penalty(logp, mb["ref_logprobs"].to(self.device), cfg.kl.kind)
                        kl_term = agg_loss(kld, mask, cfg.loss_agg_mode, global_batch=gb)
                        loss = loss + cfg.kl.coef * kl_term
                        log.losses["kl_loss"] += float(kl_term.detach())
                    log.add_token_stats(mask, stats, entropy=float((entropy.detach() * mask).sum()))
                    return loss

                self._accumulated_step(self.policy, self.optimizer, b, rows, cfg.micro_batch_size, log, micro_loss,
                                       lambda mb: self._policy_forward(self.policy, mb, False)[0])
        self.optimizer_steps += log.steps
        return self._metrics("actor", log, cfg.lr, t0)

    def update_sft(self, batch: Mapping[str, Any], lr: float | None = None) -> dict[str, float]:
        """One supervised step: token-mean negative log-likelihood of the response tokens (the prompt is context
        only), averaged over the global batch, one AdamW step at ``lr`` (default: the policy's). Metrics keys are
        prefixed ``sft/``."""
        self._require_ready()
        cfg = self.config
        t0 = time.perf_counter()
        b = self._canonical(batch)
        step_lr = cfg.lr if lr is None else float(lr)
        gb, g_tokens, _ = self._global_batch_info(b["response_mask"])
        log = _UpdateLog({"nll": 0.0})

        def micro_loss(mb: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
            logp, _ = self._policy_forward(self.policy, mb, False)
            # sum over this rank's tokens / global tokens, times dp_size (gradients are averaged over ranks)
            loss = -(logp * mask).sum() / g_tokens * gb.dp_size
            log.losses["nll"] += float(loss.detach())
            log.add_token_stats(mask, {}, token_accuracy=float(((logp.detach() > math.log(0.5)) * mask).sum()))
            return loss

        self.policy.train()
        for group in self.optimizer.param_groups:
            group["lr"] = step_lr
        try:
            if g_tokens > 0:
                self._accumulated_step(self.policy, self.optimizer, b, torch.arange(b["response_ids"].shape[0]),
                                       cfg.micro_batch_size, log, micro_loss,
                                       lambda mb: self._policy_forward(self.policy, mb, False)[0])
        finally:
            for group in self.optimizer.param_groups:
                group["lr"] = cfg.lr
        self.optimizer_steps += log.steps
        return self._metrics("sft", log, step_lr, t0)

    def rebase_reference(self) -> None:
        """Make the current policy the frozen reference and start a fresh optimizer: RL after a supervised warm
        start regularizes towards (and clips against) the warm-started model, not the initial weights. The
        reference is saved in checkpoints from then on, so a resumed run keeps it. Collective."""
        self._require_ready()
        if self.ref is None:
            self._build_reference()
        self._load_full_state(self.ref, self._full_model_state(self.policy))
        self.optimizer = self._build_optimizer(self.policy, self.config.lr, self.config.weight_decay)
        self.ref_rebased = True

    def update_critic(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """Clipped value-loss regression of the critic on ``returns``; needs ``values`` (old) and ``returns``."""
        self._require_ready()
        from pr_rlhf.algos import value_loss

        if self.critic is None:
            raise RuntimeError("the critic is disabled (critic.enabled: false)")
        cfg = self.config
        t0 = time.perf_counter()
        b = self._canonical(batch)
        for name in ("values", "returns"):
            if name not in b:
                raise KeyError(f"update_critic needs {name!r} in the batch (have {sorted(b)})")
        minis = self._mini_batches(b)
        log = _UpdateLog({"vf_loss": 0.0}, epochs=cfg.ppo_epochs)
        self.critic.train()
        for _epoch in range(cfg.ppo_epochs):
            for rows in minis:
                gb, g_tokens, g_seqs = self._global_batch_info(b["response_mask"][rows])
                if (g_seqs if cfg.loss_agg_mode.startswith("seq") else g_tokens) == 0:
                    continue

                def micro_loss(mb: dict[str, torch.Tensor], mask: torch.Tensor, gb=gb) -> torch.Tensor:
                    vpreds = self._critic_forward(self.critic, mb)
                    loss, stats = value_loss(vpreds, mb["values"].to(self.device), mb["returns"].to(self.device),
                                             mask, cfg.critic.cliprange_value, cfg.loss_agg_mode, global_batch=gb)
                    log.losses["vf_loss"] += float(loss.detach())
                    log.add_token_stats(mask, {"vf_" + k: v for k, v in stats.items()},
                                        vpred_mean=float((vpreds.detach() * mask).sum()))
                    return loss

                self._accumulated_step(self.critic, self.critic_optimizer, b, rows,
                                       cfg.critic.micro_batch_size or cfg.micro_batch_size, log, micro_loss,
                                       lambda mb: self._critic_forward(self.critic, mb))
        self.critic_optimizer_steps += log.steps
        return self._metrics("critic", log, cfg.critic.lr, t0)

    def _metrics(self, prefix: str, log: _UpdateLog, lr: float, t0: float) -> dict[str, float]:
        sums, losses, norms, post_norms = log.sums, log.losses, log.norms, log.post_norms
        n_updates = max(1, len(norms))
        # every rank saw the same mini-batches, so the union of stat names is the same on every rank except for
        # ranks that only ran dummy micro-batches: agree on the names first (sorted, via an object gather)
        names = sorted(sums)
        if self._distributed:
            gathered: list[list[str]] = [[] for _ in range(self.world_size)]
            dist.all_gather_object(gathered, names)
            names = sorted({n for g in gathered for n in g})
        loss_names = sorted(losses)
        reduced = self._reduce([sums.get(n, 0.0) for n in names] + [losses[n] for n in loss_names])
        totals = dict(zip(names + loss_names, reduced))
        tokens = totals.pop("_tokens", 0.0)
        out: dict[str, float] = {}
        for name in names:
            if name != "_tokens":
                out[f"{prefix}/{name}"] = totals[name] / tokens if tokens else 0.0
        for name in loss_names:
            if name == "kl_loss" and not (prefix == "actor" and self.config.kl_in_loss):
                continue
            if name == "entropy_loss" and not (prefix == "actor" and self.config.entropy_coef > 0):
                continue
            # each micro-batch loss is (global normalizer) x dp_size: the sum over ranks / dp is the global loss
            out[f"{prefix}/{name}"] = totals[name] / self.world_size / n_updates
        finite = [n for n in norms if math.isfinite(n)]
        out[f"{prefix}/grad_norm"] = float(np.mean(finite)) if finite else float("nan") if norms else 0.0
        out[f"{prefix}/grad_norm_max"] = max(finite) if finite else 0.0
        out[f"{prefix}/grad_norm_post_clip"] = max((p for p in post_norms if math.isfinite(p)), default=0.0)
        out[f"{prefix}/lr"] = lr
        out[f"{prefix}/optimizer_steps"] = float(log.steps)
        out[f"{prefix}/skipped_steps"] = float(log.skipped)
        out[f"{prefix}/num_tokens"] = tokens / log.epochs
        out[f"{prefix}/update_time_s"] = time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------------------------------- state dicts
    def _full_model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded) state dict, on CPU, on rank 0; ``{}`` on the other ranks. Collective."""
        if self.config.strategy == "deepspeed":  # pragma: no cover
            return self._deepspeed_full_state(model)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        self._reshard(model)
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.rank == 0 else {}

    def _deepspeed_full_state(self, engine: Any) -> dict[str, torch.Tensor]:  # pragma: no cover
        import deepspeed

        module = engine.module
        params = list(module.parameters())
        ctx = deepspeed.zero.GatheredParameters(params, modifier_rank=None) if self.config.zero_stage == 3 \
            else nullcontext()
        with ctx:
            state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()} if self.rank == 0 else {}
        return state

    def state_dict_for_rollout(self, dtype: str | None = None) -> dict[str, torch.Tensor]:
        """The policy's full state dict (HF parameter names, CPU tensors) on rank 0, ``{}`` on the others, for
        loading into the rollout engine (``reload_weights``). ``dtype`` casts floating tensors (e.g. 'bfloat16')."""
        self._require_ready()
        state = self._full_model_state(self.policy)
        if dtype is not None and state:
            target = _torch_dtype(dtype)
            state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
        return state

    # -------------------------------------------------------------------------------------------- checkpoints
    def _full_optim_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        has_state = self._reduce([1.0 if optimizer.state else 0.0], op="max")[0] > 0
        if not has_state:  # no step yet: an empty optimizer (get_optimizer_state_dict would initialize one)
            return None
        state = get_optimizer_state_dict(model, optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.rank == 0 else {}

    def save_checkpoint(self, path: str | os.PathLike, step: int, data_position: Any = None) -> str:
        """Save everything needed to resume exactly: weights (safetensors, an HF-loadable directory per model),
        optimizer state (``torch.save`` of tensors and numbers), per-rank RNG states, ``step`` and
        ``data_position`` (any JSON value). ``meta.json`` is written last: its presence marks a complete
        checkpoint. Collective; returns the directory."""
        self._require_ready()
        root = Path(path)
        if self.rank == 0:
            if root.exists() and (root / _META).exists():
                (root / _META).unlink()  # overwriting: incomplete until the new meta lands
            root.mkdir(parents=True, exist_ok=True)
            (root / "rng").mkdir(exist_ok=True)
        self._barrier()
        torch.save(_rng_state(), root / "rng" / f"rank_{self.rank}.pt")
        models: dict[str, Any] = {}
        for name, model, optimizer in self._trained_models():
            if self.config.strategy == "deepspeed":  # pragma: no cover
                model.save_checkpoint(str(root / "deepspeed" / name), tag="latest")
                optim_state: dict[str, Any] | None = {}
            else:
                optim_state = self._full_optim_state(model, optimizer)
            weights = self._full_model_state(model)
            if self.rank == 0:
                self._write_weights(root / name, name, weights)
                if optim_state:
                    torch.save(optim_state, root / name / "optimizer.pt")
            models[name] = {"optimizer": optim_state is not None}
            del weights, optim_state
        if self.ref_rebased:  # the reference is no longer the model directory's weights: keep it
            weights = self._full_model_state(self.ref)
            if self.rank == 0:
                self._write_weights(root / "reference", "reference", weights)
            models["reference"] = {"optimizer": False}
            del weights
        self._barrier()
        if self.rank == 0:
            meta = {"format": CHECKPOINT_FORMAT, "step": int(step), "data_position": data_position,
                    "world_size": self.world_size, "strategy": self.config.strategy, "models": models,
                    "optimizer_steps": self.optimizer_steps, "critic_optimizer_steps": self.critic_optimizer_steps,
                    "config": self.config.model_dump(mode="json"), "saved_at": time.time()}
            _atomic_write_text(root / _META, json.dumps(meta, indent=1))
        self._barrier()
        return str(root)

    def _rank0_weights(self, folder: Path) -> dict[str, torch.Tensor]:
        """A saved model's weights, read by rank 0 only when distributed (the others get them by broadcast)."""
        return _load_safetensors(folder / "model.safetensors") if self.rank == 0 or not self._distributed else {}

    def _load_full_state(self, model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
        """Load a full state dict (present on rank 0 only when distributed) into a sharded or plain model."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        self._reshard(model)
        set_model_state_dict(model, dict(weights), options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=self._distributed, strict=True))
        self._reshard(model)

    def _trained_models(self) -> list[tuple[str, nn.Module, torch.optim.Optimizer]]:
        out = [("policy", self.policy, self.optimizer)]
        if self.critic is not None:
            out.append(("critic", self.critic, self.critic_optimizer))
        return out

    def _write_weights(self, folder: Path, name: str, weights: Mapping[str, torch.Tensor]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        _save_safetensors(weights, folder / "model.safetensors")
        if name == "policy":  # an HF-loadable model directory (config + tokenizer next to the weights)
            src = Path(self.model_dir)
            for f in src.iterdir():
                if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".pt")) \
                        and not f.name.endswith(".safetensors.index.json"):
                    shutil.copy2(f, folder / f.name)

    @staticmethod
    def read_checkpoint_meta(path: str | os.PathLike) -> dict[str, Any]:
        meta_path = Path(path) / _META
        if not meta_path.is_file():
            raise FileNotFoundError(f"{path}: no {_META}: not a learner checkpoint, or an incomplete one")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: checkpoint format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
        return meta

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore weights, optimizer state, RNG states and counters saved by ``save_checkpoint`` (any world size
        for weights and optimizer; RNG states per rank when the world size matches). Collective. Returns
        ``{"step", "data_position", ...}`` from the checkpoint."""
        self._require_ready()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        root = Path(path)
        meta = self.read_checkpoint_meta(root)
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=self._distributed, strict=True)
        for name, model, optimizer in self._trained_models():
            if name not in meta["models"]:
                raise ValueError(f"{root}: the checkpoint holds no {name!r} (saved with {sorted(meta['models'])})")
            if self.config.strategy == "deepspeed":  # pragma: no cover
                model.load_checkpoint(str(root / "deepspeed" / name), tag="latest")
                continue
            self._load_full_state(model, self._rank0_weights(root / name))
            if meta["models"][name]["optimizer"]:
                osd = torch.load(root / name / "optimizer.pt", weights_only=True, map_location="cpu") \
                    if self.rank == 0 or not self._distributed else {}
                set_optimizer_state_dict(model, optimizer, osd, options=opts)
            else:  # saved before the first step: a fresh optimizer
                fresh = self._build_optimizer(model, optimizer.param_groups[0]["lr"],
                                              optimizer.param_groups[0]["weight_decay"])
                if name == "policy":
                    self.optimizer = fresh
                else:
                    self.critic_optimizer = fresh
        if "reference" in meta["models"]:
            if self.ref is None:
                self._build_reference()
            self._load_full_state(self.ref, self._rank0_weights(root / "reference"))
            self.ref_rebased = True
        rng_file = root / "rng" / f"rank_{self.rank}.pt"
        if rng_file.is_file() and meta["world_size"] == self.world_size:
            _set_rng_state(torch.load(rng_file, weights_only=True))
        else:
            log.warning("%s: no RNG state for rank %d of %d; reseeding", root, self.rank, self.world_size)
            _seed_everything(self.config.seed + self.rank + int(meta["step"]))
        self.optimizer_steps = int(meta.get("optimizer_steps", 0))
        self.critic_optimizer_steps = int(meta.get("critic_optimizer_steps", 0))
        self._barrier()
        return {"step": meta["step"], "data_position": meta["data_position"], "world_size": meta["world_size"],
                "path": str(root)}

    # ------------------------------------------------------------------------------------------------ misc
    def rng_sample(self) -> list[float]:
        """Draw one number from each of torch / numpy / python random (advances them): tests RNG restoration."""
        return [float(torch.rand(())), float(np.random.random()), random.random()]

    def shutdown(self) -> None:
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_process_group = False


# =================================================================================================================
# The group (driver side)
# =================================================================================================================

class LearnerGroup:
    """``world_size`` ``LearnerWorker`` actors in one placement group, driven together.

    Inference calls split the batch into contiguous per-rank chunks and concatenate the results in order. Updates
    split each global mini-batch (``mini_batch_size`` samples, in batch order) across the ranks, so a step sees the
    same samples whatever the world size. Needs ``ray.init()`` first.
    """

    def __init__(self, config: LearnerConfig | Mapping[str, Any], *, name: str | None = None,
                 ready_timeout_s: float = 300.0, runtime_env: dict[str, Any] | None = None) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.config = config if isinstance(config, LearnerConfig) else LearnerConfig.model_validate(config)
        cfg = self.config
        self.world_size = cfg.world_size
        use_gpu = cfg.device == "cuda" or (cfg.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
        bundle = {"CPU": cfg.num_cpus_per_worker, **({"GPU": cfg.num_gpus_per_worker} if use_gpu else {}),
                  **cfg.resources}
        self._pg = reserve_bundles([dict(bundle) for _ in range(self.world_size)], cfg.placement_strategy,
                                   "learner", ready_timeout_s)
        remote_cls = ray.remote(LearnerWorker)
        options: dict[str, Any] = {"num_cpus": cfg.num_cpus_per_worker,
                                   "num_gpus": cfg.num_gpus_per_worker if use_gpu else 0}
        if runtime_env:
            options["runtime_env"] = runtime_env
        self.workers = [
            remote_cls.options(**options, name=f"{name}-rank{r}" if name else None,
                               scheduling_strategy=PlacementGroupSchedulingStrategy(
                                   placement_group=self._pg, placement_group_bundle_index=r)).remote(
                cfg.model_dump(mode="json"), r)
            for r in range(self.world_size)]
        try:
            endpoints = ray.get([w.node_endpoint.remote() for w in self.workers])
            ip, port, _ = endpoints[0]
            self.master_addr = "127.0.0.1" if len({e[2] for e in endpoints}) == 1 else ip
            self.master_port = port
            self.info = ray.get([w.setup.remote(self.master_addr, port) for w in self.workers])
        except Exception:
            self.shutdown()
            raise

    # -------------------------------------------------------------------------------------------- fan out
    def _call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        import ray

        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def _split(self, batch: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        n = batch["response_ids"].shape[0]
        return [take_rows(batch, idx) for idx in np.array_split(np.arange(n), self.world_size)]

    def _inference(self, method: str, batch: Mapping[str, Any]) -> torch.Tensor:
        import ray

        parts = self._split(collate(batch))
        return torch.cat(ray.get([getattr(w, method).remote(p) for w, p in zip(self.workers, parts)]), dim=0)

    def compute_logprobs(self, batch: Mapping[str, Any]) -> torch.Tensor:
        return self._inference("compute_logprobs", batch)

    def compute_ref_logprobs(self, batch: Mapping[str, Any]) -> torch.Tensor:
        return self._inference("compute_ref_logprobs", batch)

    def compute_values(self, batch: Mapping[str, Any]) -> torch.Tensor:
        return self._inference("compute_values", batch)

    def _update_parts(self, batch: Mapping[str, Any]) -> list[dict[str, torch.Tensor]]:
        b = collate(batch)
        n = b["response_ids"].shape[0]
        size = self.config.mini_batch_size or max(n, 1)
        per_rank: list[list[int]] = [[] for _ in range(self.world_size)]
        mini_of: list[list[int]] = [[] for _ in range(self.world_size)]
        for k, start in enumerate(range(0, n, size)):
            for r, idx in enumerate(np.array_split(np.arange(start, min(start + size, n)), self.world_size)):
                per_rank[r].extend(int(i) for i in idx)
                mini_of[r].extend([k] * len(idx))
        parts = []
        for r in range(self.world_size):
            part = take_rows(b, per_rank[r])
            part["minibatch_index"] = torch.tensor(mini_of[r], dtype=torch.long)
            parts.append(part)
        return parts

    def _update(self, method: str, batch: Mapping[str, Any]) -> dict[str, float]:
        import ray

        parts = self._update_parts(batch)
        return ray.get([getattr(w, method).remote(p) for w, p in zip(self.workers, parts)])[0]

    def update_policy(self, batch: Mapping[str, Any]) -> dict[str, float]:
        return self._update("update_policy", batch)

    def update_critic(self, batch: Mapping[str, Any]) -> dict[str, float]:
        return self._update("update_critic", batch)

    def update_sft(self, batch: Mapping[str, Any], lr: float | None = None) -> dict[str, float]:
        import ray

        parts = self._split(collate(batch))
        return ray.get([w.update_sft.remote(p, lr) for w, p in zip(self.workers, parts)])[0]

    def rebase_reference(self) -> None:
        self._call_all("rebase_reference")

    def state_dict_for_rollout(self, dtype: str | None = None) -> dict[str, torch.Tensor]:
        return self._call_all("state_dict_for_rollout", dtype)[0]

    def save_checkpoint(self, path: str | os.PathLike, step: int, data_position: Any = None) -> str:
        return self._call_all("save_checkpoint", str(path), step, data_position)[0]

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        return self._call_all("load_checkpoint", str(path))[0]

    def rng_sample(self) -> list[list[float]]:
        return self._call_all("rng_sample")

    def describe(self) -> list[dict[str, Any]]:
        return self._call_all("describe")

    def shutdown(self) -> None:
        """Kill the actors and release the placement group."""
        import ray

        for w in getattr(self, "workers", []):
            with suppress(Exception):  # already gone
                ray.kill(w)
        self.workers = []
        release_bundles(getattr(self, "_pg", None))
        self._pg = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
