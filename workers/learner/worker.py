"""``LearnerWorker``: one learner rank (``LearnerGroup`` runs it as a Ray actor; a lone rank also runs in-process).

It owns

- the **policy** (HF causal LM, trained with AdamW),
- a frozen **reference** copy of the initial policy (built eagerly when ``kl.coef > 0``, else on the first
  ``compute_ref_logprobs``), held like the policy,
- optionally a **critic** (the policy's backbone, a copy of the initial weights, with a scalar value head) for PPO;

or, with ``trains: reward_model``, only a **reward model** (an HF sequence-classification model) trained with the
Bradley-Terry loss (``update_reward_model``, ``compute_rewards``).

How the models are held (FSDP2 shards or a plain module) is ``workers.learner.strategy``; the batch format is
``pr_rlhf.rl.batches``; the losses are ``pr_rlhf.rl.objectives``; checkpoints are ``workers.learner.checkpoint``.

Outputs of ``compute_logprobs`` / ``compute_ref_logprobs`` / ``compute_values`` are float32 ``[B, T]`` CPU
tensors, right-padded like the input responses (the width of a tensor input is kept; ragged input gives
``T = max response length``), 0 after each response (``pr_rlhf.rl.forward``).

``update_policy`` / ``update_critic`` run ``ppo_epochs`` passes over the mini-batches (``mini_batch_size`` global
samples, in batch order; ``LearnerGroup`` splits each one across the ranks), one AdamW step per mini-batch, with
gradients accumulated over micro-batches (``workers.learner.micro_batches``). Same seed + same data => bitwise
the same weights (CPU), also across a checkpoint and resume.
"""
from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.rl import objectives
from pr_rlhf.rl.batches import collate, join_pair_sides, minibatch_index, reward_model_batch, scored_rows
from pr_rlhf.rl.forward import response_logprobs, response_values, sequence_rewards
from pr_rlhf.rl.modeling import attention_for, load_causal_lm, load_critic, load_reward_model
from pr_rlhf.rl.update_log import UpdateLog
from pr_rlhf.threads import set_torch_threads
from workers.learner import checkpoint
from workers.learner.micro_batches import MicroBatchRunner, MicroOutput
from workers.learner.ranks import join_process_group, node_endpoint
from workers.learner.strategy import make_strategy

log = logging.getLogger(__name__)


def _peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports kilobytes)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


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
        self.reward_model: nn.Module | None = None
        self.ref: nn.Module | None = None
        self.critic: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self.optimizer_steps = 0
        self.critic_optimizer_steps = 0
        self.ref_rebased = False     # True once rebase_reference() made the reference a copy of the policy
        self._owns_process_group = False
        if self.config.torch_threads:
            set_torch_threads(self.config.torch_threads)

    # ------------------------------------------------------------------------------------------------- setup
    def node_endpoint(self) -> tuple[str, int, str]:
        """(this node's IP, a free port, the Ray node id): rank 0 offers the first two as MASTER_ADDR / PORT."""
        return node_endpoint()

    def setup(self, master_addr: str | None = None, master_port: int | None = None) -> dict[str, Any]:
        """Join the process group, load the models, build the optimizers. Returns a short description."""
        if self._ready:
            return self.describe()
        t0 = time.perf_counter()
        cfg = self.config
        self.ranks, self._owns_process_group = join_process_group(self.rank, self.world_size, cfg.device,
                                                                  master_addr, master_port)
        self.device = self.ranks.device
        self.compute_dtype = getattr(torch, cfg.dtype)
        self.strategy = make_strategy(cfg.strategy, self.device, self.compute_dtype, self.world_size)

        from pr_rlhf.models.hf_engine import quiet_hf_loading
        from pr_rlhf.models.sources import resolve_model

        quiet_hf_loading()
        self.model_dir = resolve_model(cfg.model)
        checkpoint.seed_everything(cfg.seed)  # identical initialization (critic / RM head) on every rank
        if cfg.trains == "reward_model":
            self._setup_reward_model()
        else:
            self._setup_policy()
        checkpoint.seed_everything(cfg.seed + self.rank)  # per-rank streams from here on
        self.micro = MicroBatchRunner(self.ranks, self.strategy, self.pad_token_id, cfg.grad_clip)
        self.ranks.barrier()
        self._ready = True
        self.setup_time_s = time.perf_counter() - t0
        return self.describe()

    def _setup_policy(self) -> None:
        cfg = self.config
        dtype, attn = self._attn("policy")
        self.policy = self._place(lambda meta: load_causal_lm(
            self.model_dir, dtype, attn, trainable=True, gradient_checkpointing=cfg.gradient_checkpointing,
            meta=meta))
        self.pad_token_id = int(getattr(self.policy.config, "pad_token_id", None) or 0)
        self.optimizer = self._build_optimizer(self.policy, cfg.lr, cfg.weight_decay)
        if cfg.needs_reference:
            self._build_reference()
        if cfg.critic.enabled:
            self.critic = self._place(lambda meta: load_critic(
                self.model_dir, self._attn("critic")[1], gradient_checkpointing=cfg.gradient_checkpointing,
                meta=meta))
            self.critic_optimizer = self._build_optimizer(self.critic, cfg.critic.lr, cfg.critic.weight_decay)
        from pr_rlhf.algos import POLICY_LOSSES

        POLICY_LOSSES.get(cfg.policy_loss)  # unknown names fail at setup, not at the first update

    def _setup_reward_model(self) -> None:
        from transformers import AutoTokenizer

        cfg = self.config
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        # the pad id the scalar RM scores with (pr_rlhf.reward.scalar): eos when the tokenizer has none
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad or 0)
        self.reward_model = self._place(lambda meta: load_reward_model(
            self.model_dir, self._attn("reward_model")[1], self.pad_token_id,
            gradient_checkpointing=cfg.gradient_checkpointing, meta=meta))
        self.optimizer = self._build_optimizer(self.reward_model, cfg.lr, cfg.weight_decay)

    @property
    def trained(self) -> nn.Module | None:
        """The model this learner optimizes: the policy, or the reward model."""
        return self.reward_model if self.config.trains == "reward_model" else self.policy

    def describe(self) -> dict[str, Any]:
        n_params = sum(p.numel() for p in self.trained.parameters()) if self.trained is not None else 0
        return {"rank": self.rank, "world_size": self.world_size, "strategy": self.config.strategy,
                "trains": self.config.trains,
                "device": str(self.device), "backend": dist.get_backend() if dist.is_initialized() else None,
                "model_dir": self.model_dir, "local_trained_params": int(n_params),
                "reference": self.ref is not None, "critic": self.critic is not None,
                "optimizer_steps": self.optimizer_steps, "setup_time_s": getattr(self, "setup_time_s", None),
                "pid": os.getpid(), "node_id": self.node_endpoint()[2], "peak_rss_bytes": _peak_rss_bytes(),
                "read_weights": getattr(self, "read_weights", None)}

    def _attn(self, role: str) -> tuple[torch.dtype, str]:
        """(load dtype, attention kernel) of model ``role``: pr_rlhf.rl.modeling.attention_for."""
        return attention_for(self.config, role, self.device.type)

    def _build_reference(self) -> None:
        dtype, attn = self._attn("reference")   # dtype == self.strategy.reference_dtype (tested)
        self.ref = self._place(lambda meta: load_causal_lm(self.model_dir, dtype, attn, trainable=False, meta=meta),
                               frozen=True)

    def _place(self, build: Callable[[bool], nn.Module], frozen: bool = False) -> nn.Module:
        """A model placed (and sharded) by the strategy. With fsdp2 over several ranks and ``load_weights_on:
        rank0``, only rank 0 reads the weights (``build(False)``); the others build the structure on the meta
        device (``build(True)``), allocate just their shards, and receive rank 0's weights and buffers by
        broadcast: one full copy on one host per group instead of one per rank."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        from_rank0 = (self.config.strategy == "fsdp2" and self.ranks.distributed
                      and self.config.load_weights_on == "rank0")
        self.read_weights = not (from_rank0 and self.rank != 0)
        model = build(not self.read_weights)
        full = model.state_dict() if from_rank0 and self.rank == 0 else {}
        model = self.strategy.wrap(model, frozen=frozen)
        if from_rank0:
            if self.rank != 0:
                model.to_empty(device=self.device)
            set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True,
                                                                       broadcast_from_rank0=True, strict=True))
            del full
            for buffer in model.buffers():   # non-persistent ones (rotary frequencies) are in no state dict
                dist.broadcast(buffer, src=0)
            self.strategy.reshard(model)
        return model

    def _build_optimizer(self, model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, betas=tuple(self.config.betas), eps=self.config.eps,
                                 weight_decay=weight_decay)

    def _require_ready(self, trains: str = "policy") -> None:
        if not self._ready:
            raise RuntimeError("LearnerWorker.setup() has not run")
        if self.config.trains != trains:
            raise RuntimeError(f"this learner trains a {self.config.trains.replace('_', ' ')} (trains: "
                               f"{self.config.trains}); the call needs trains: {trains}")

    # ------------------------------------------------------------------------------------------------ forward
    def _logprobs(self, model: nn.Module, mb: Mapping[str, torch.Tensor], with_entropy: bool = False,
                  entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        return response_logprobs(model, mb, device=self.device, autocast=self.strategy.autocast(),
                                 temperature=self.config.temperature, shared_prefix=self.config.shared_prefix,
                                 pad_token_id=self.pad_token_id, with_entropy=with_entropy,
                                 entropy_grad=entropy_grad)

    def _values(self, model: nn.Module, mb: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return response_values(model, mb, device=self.device, autocast=self.strategy.autocast())

    def _forward_all(self, model: nn.Module, batch: Mapping[str, Any], fn: MicroOutput) -> torch.Tensor:
        size = self.config.forward_micro_batch_size or self.config.micro_batch_size
        return self.micro.forward_all(model, self._canonical(batch), size, fn)

    def _canonical(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        return collate(batch, pad_token_id=self.pad_token_id)

    def _rewards(self, model: nn.Module, mb: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return sequence_rewards(model, mb, device=self.device, autocast=self.strategy.autocast())

    def compute_rewards(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The reward model's scores ``[B]`` of whole sequences: ``{"input_ids": ragged token ids}``, or rows
        whose one-token responses are each sequence's last token (``pr_rlhf.rl.batches.scored_rows``)."""
        self._require_ready("reward_model")
        rows = scored_rows(batch["input_ids"]) if "input_ids" in batch else batch
        return self._forward_all(self.reward_model, rows, lambda m, mb: self._rewards(m, mb)[:, None])[:, 0]

    def compute_logprobs(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Per-token log-probs ``[B, T]`` of the responses under the current policy."""
        self._require_ready()
        return self._forward_all(self.policy, batch, lambda m, mb: self._logprobs(m, mb)[0])

    def compute_ref_logprobs(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Per-token log-probs ``[B, T]`` under the frozen reference (the initial policy)."""
        self._require_ready()
        if self.ref is None:
            self._build_reference()
        return self._forward_all(self.ref, batch, lambda m, mb: self._logprobs(m, mb)[0])

    def compute_values(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Critic values ``[B, T]``: ``values[i, t]`` = V(prompt_i + response_i[:t])."""
        self._require_ready()
        if self.critic is None:
            raise RuntimeError("the critic is disabled (critic.enabled: false)")
        return self._forward_all(self.critic, batch, self._values)

    # ------------------------------------------------------------------------------------------------ updates
    def _mini_batches(self, b: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """Row indices of each mini-batch; the same count on every rank (possibly empty on some)."""
        index = minibatch_index(b, self.world_size, self.config.mini_batch_size)
        count = int(self.ranks.reduce([int(index.max()) + 1 if len(index) else 0], op="max")[0])
        return [torch.nonzero(index == k).flatten() for k in range(count)]

    def _nothing_to_learn(self, tokens: float, seqs: float) -> bool:
        return (seqs if self.config.loss_agg_mode.startswith("seq") else tokens) == 0

    def update_policy(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """PPO / GRPO policy update: ``ppo_epochs`` passes over the mini-batches, one AdamW step each.

        Needs ``old_logprobs`` and ``advantages`` (and ``ref_logprobs`` when the KL is in the loss; computed here
        if absent). Returns global metrics (identical on every rank), keys prefixed ``actor/``.
        """
        self._require_ready()
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
        log = UpdateLog.of(objectives.policy_loss_terms(cfg), epochs=cfg.ppo_epochs)
        self.policy.train()
        for _epoch in range(cfg.ppo_epochs):
            for rows in minis:
                gb, g_tokens, g_seqs = self.micro.global_batch_info(b["response_mask"][rows])
                if self._nothing_to_learn(g_tokens, g_seqs):
                    continue  # every rank skips together

                def micro_loss(mb: dict[str, torch.Tensor], mask: torch.Tensor, gb=gb) -> objectives.MicroLoss:
                    logp, entropy = self._logprobs(self.policy, mb, True, entropy_grad=cfg.entropy_coef > 0)
                    return objectives.policy_objective(
                        cfg, logp, entropy, logp.detach() if on_policy else mb["old_logprobs"].to(self.device),
                        mb["advantages"].to(self.device), mask, gb,
                        mb["ref_logprobs"].to(self.device) if cfg.kl_in_loss else None,
                        mb["behaviour_logprobs"].to(self.device) if "behaviour_logprobs" in mb else None)

                self.micro.accumulated_step(self.policy, self.optimizer, b, rows, cfg.micro_batch_size, log,
                                            micro_loss, lambda m, mb: self._logprobs(m, mb)[0])
        self.optimizer_steps += log.steps
        return self.micro.metrics("actor", log, cfg.lr, t0)

    def update_critic(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """Clipped value-loss regression of the critic on ``returns``; needs ``values`` (old) and ``returns``."""
        self._require_ready()
        if self.critic is None:
            raise RuntimeError("the critic is disabled (critic.enabled: false)")
        cfg = self.config
        t0 = time.perf_counter()
        b = self._canonical(batch)
        for name in ("values", "returns"):
            if name not in b:
                raise KeyError(f"update_critic needs {name!r} in the batch (have {sorted(b)})")
        minis = self._mini_batches(b)
        log = UpdateLog.of(["vf_loss"], epochs=cfg.ppo_epochs)
        self.critic.train()
        for _epoch in range(cfg.ppo_epochs):
            for rows in minis:
                gb, g_tokens, g_seqs = self.micro.global_batch_info(b["response_mask"][rows])
                if self._nothing_to_learn(g_tokens, g_seqs):
                    continue

                def micro_loss(mb: dict[str, torch.Tensor], mask: torch.Tensor, gb=gb) -> objectives.MicroLoss:
                    return objectives.critic_objective(cfg, self._values(self.critic, mb),
                                                       mb["values"].to(self.device), mb["returns"].to(self.device),
                                                       mask, gb)

                self.micro.accumulated_step(self.critic, self.critic_optimizer, b, rows,
                                            cfg.critic.micro_batch_size or cfg.micro_batch_size, log, micro_loss,
                                            self._values)
        self.critic_optimizer_steps += log.steps
        return self.micro.metrics("critic", log, cfg.critic.lr, t0)

    def update_sft(self, batch: Mapping[str, Any], lr: float | None = None) -> dict[str, float]:
        """One supervised step: token-mean negative log-likelihood of the response tokens (the prompt is context
        only), averaged over the global batch, one AdamW step at ``lr`` (default: the policy's). Metrics keys are
        prefixed ``sft/``."""
        self._require_ready()
        cfg = self.config
        t0 = time.perf_counter()
        b = self._canonical(batch)
        gb, g_tokens, _ = self.micro.global_batch_info(b["response_mask"])
        log = UpdateLog.of(["nll"])
        self.policy.train()
        with self._learning_rate(lr) as step_lr:
            if g_tokens > 0:
                self.micro.accumulated_step(
                    self.policy, self.optimizer, b, torch.arange(b["response_ids"].shape[0]), cfg.micro_batch_size,
                    log, lambda mb, mask: objectives.sft_objective(self._logprobs(self.policy, mb)[0], mask, gb),
                    lambda m, mb: self._logprobs(m, mb)[0])
        self.optimizer_steps += log.steps
        return self.micro.metrics("sft", log, step_lr, t0)

    @contextmanager
    def _learning_rate(self, lr: float | None) -> Iterator[float]:
        """The optimizer at ``lr`` (None: the config's) for one update, then back at the config's."""
        step_lr = self.config.lr if lr is None else float(lr)
        for group in self.optimizer.param_groups:
            group["lr"] = step_lr
        try:
            yield step_lr
        finally:
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.lr

    def update_reward_model(self, batch: Mapping[str, Any], lr: float | None = None) -> dict[str, float]:
        """Bradley-Terry update on pairs (``pr_rlhf.rl.batches.reward_model_batch``) at ``lr`` (default: the
        config's): one AdamW step per global mini-batch of ``mini_batch_size`` pairs (None: the whole batch),
        gradients accumulated over micro-batches of ``micro_batch_size`` pairs (each one forward of its chosen and
        rejected sequences together). Metrics keys are prefixed ``rm/``."""
        self._require_ready("reward_model")
        cfg = self.config
        t0 = time.perf_counter()
        b = reward_model_batch(batch, self.pad_token_id)
        log = UpdateLog.of(["bt_loss"])
        self.reward_model.train()
        with self._learning_rate(lr) as step_lr:
            for rows in self._mini_batches(b):
                gb, _, g_pairs = self.micro.global_batch_info(b["response_mask"][rows])
                if g_pairs == 0:
                    continue

                def micro_loss(mb: dict[str, torch.Tensor], mask: torch.Tensor, gb=gb) -> objectives.MicroLoss:
                    scores = self._rewards(self.reward_model, join_pair_sides(mb))
                    n = mb["response_ids"].shape[0]
                    return objectives.reward_model_objective(scores[:n], scores[n:], mb["margin"].to(self.device),
                                                             gb)

                self.micro.accumulated_step(self.reward_model, self.optimizer, b, rows, cfg.micro_batch_size, log,
                                            micro_loss, lambda m, mb: self._rewards(m, mb))
        self.optimizer_steps += log.steps
        return self.micro.metrics("rm", log, step_lr, t0)

    def rebase_reference(self) -> None:
        """Make the current policy the frozen reference and start a fresh optimizer: RL after a supervised warm
        start regularizes towards (and clips against) the warm-started model, not the initial weights. The
        reference is saved in checkpoints from then on, so a resumed run keeps it. Collective."""
        self._require_ready()
        if self.ref is None:
            self._build_reference()
        checkpoint.load_full_model_state(self.ref, self._full_state(self.policy), self.strategy, self.ranks)
        self.optimizer = self._build_optimizer(self.policy, self.config.lr, self.config.weight_decay)
        self.ref_rebased = True

    # ------------------------------------------------------------------------------------------- state dicts
    def _full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return checkpoint.full_model_state(model, self.strategy, self.ranks)

    def state_dict_for_rollout(self, dtype: str | None = None) -> dict[str, torch.Tensor]:
        """The policy's full state dict (HF parameter names, CPU tensors) on rank 0, ``{}`` on the others, for
        loading into the rollout engine (``reload_weights``). ``dtype`` casts floating tensors (e.g. 'bfloat16')."""
        self._require_ready()
        state = self._full_state(self.policy)
        if dtype is not None and state:
            target = getattr(torch, dtype)
            state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
        return state

    # ------------------------------------------ weight sync (vLLM's weight-transfer API: learner/weight_transfer.py)
    def open_weight_transfer(self, rollouts: list, receivers: list[int], backend: str, dtype: str, host: str,
                             port: int) -> None:
        """Every rank: this rank's trainer engine for these rollout engines (rank 0 forms the group with them)."""
        from workers.learner.weight_transfer import LearnerTransfer

        self._require_ready()
        self.close_weight_transfer()
        cfg = self.config
        self._transfer = LearnerTransfer(self.weight_source(dtype), self.ranks, rollouts, receivers, backend, host,
                                         port, cfg.weight_sync_bucket_mb << 20, cfg.weight_sync_timeout_s)

    def weight_source(self, dtype: str) -> Any:
        """What a sync sends: the policy, each parameter gathered whole and cast to ``dtype``."""
        from workers.learner.weight_transfer import policy_source

        return policy_source(self.policy, dtype)

    def send_weights(self, version: int) -> None:
        """Collective: the policy into every engine of the open transfer, parameter by parameter; raises on every
        rank when the sync failed anywhere (the engines then still hold their previous weights)."""
        self._require_ready()
        if getattr(self, "_transfer", None) is None:
            raise RuntimeError("send_weights: open_weight_transfer was never called")
        self.strategy.reshard(self.policy)
        self._transfer.send(version)

    def close_weight_transfer(self) -> None:
        transfer, self._transfer = getattr(self, "_transfer", None), None
        if transfer is not None:
            transfer.close()

    # -------------------------------------------------------------------------------------------- checkpoints
    def _trained_models(self) -> list[tuple[str, nn.Module, torch.optim.Optimizer]]:
        if self.config.trains == "reward_model":
            return [("reward_model", self.reward_model, self.optimizer)]
        out = [("policy", self.policy, self.optimizer)]
        if self.critic is not None:
            out.append(("critic", self.critic, self.critic_optimizer))
        return out

    def save_checkpoint(self, path: str | os.PathLike, step: int, data_position: Any = None) -> str:
        """Save everything needed to resume exactly: every rank writes its shards of the weights and optimizer
        states (``workers.learner.checkpoint``: torch.distributed.checkpoint, loadable at any world size) and its
        RNG states; the policy (or reward model) is streamed out as an HF model directory beside them; ``step`` and
        ``data_position`` (any JSON value) go into ``meta.json``, written last: its presence marks a complete
        checkpoint. Collective; returns the directory."""
        self._require_ready(self.config.trains)
        meta = {"step": int(step), "data_position": data_position, "strategy": self.config.strategy,
                "optimizer_steps": self.optimizer_steps, "critic_optimizer_steps": self.critic_optimizer_steps,
                "config": self.config.model_dump(mode="json")}
        # the reference is kept once it is no longer the model directory's weights
        checkpoint.save_checkpoint(Path(path), trained=self._trained_models(),
                                   reference=self.ref if self.ref_rebased else None, strategy=self.strategy,
                                   ranks=self.ranks, model_dir=self.model_dir, meta=meta)
        return str(Path(path))

    def export_model(self, path: str | os.PathLike, max_shard_bytes: int | None = None) -> str:
        """The trained model (policy or reward model) as an HF model folder: safetensors weights (one file, or HF's
        sharded layout of files up to ``max_shard_bytes``, default ``checkpoint.EXPORT_SHARD_BYTES``), its config
        and the tokenizer, nothing to resume from. Streamed: the ranks gather one tensor at a time and rank 0
        writes one file at a time, so no host holds the whole model. Collective; returns the folder."""
        self._require_ready(self.config.trains)
        checkpoint.export_hf_folder(Path(path), self.trained, self.model_dir, self.strategy, self.ranks,
                                    max_shard_bytes)
        return str(Path(path))

    @staticmethod
    def read_checkpoint_meta(path: str | os.PathLike) -> dict[str, Any]:
        return checkpoint.read_checkpoint_meta(path)

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore weights, optimizer state, RNG states and counters saved by ``save_checkpoint`` (any world size
        for weights and optimizer; RNG states per rank when the world size matches). Collective. Returns
        ``{"step", "data_position", ...}`` from the checkpoint."""
        self._require_ready(self.config.trains)
        root = Path(path)
        meta = checkpoint.read_checkpoint_meta(root)
        models: dict[str, tuple[nn.Module, torch.optim.Optimizer | None]] = {}
        for name, model, optimizer in self._trained_models():
            if name not in meta["models"]:
                raise ValueError(f"{root}: the checkpoint holds no {name!r} (saved with {sorted(meta['models'])})")
            if meta["models"][name]["optimizer"]:
                models[name] = (model, optimizer)
                continue
            # saved before the first step: a fresh optimizer
            fresh = self._build_optimizer(model, optimizer.param_groups[0]["lr"],
                                          optimizer.param_groups[0]["weight_decay"])
            if name == "critic":
                self.critic_optimizer = fresh
            else:
                self.optimizer = fresh
            models[name] = (model, None)
        if "reference" in meta["models"]:
            if self.ref is None:
                self._build_reference()
            models["reference"] = (self.ref, None)
        checkpoint.load_checkpoint(root, meta, models, self.strategy, self.ranks)
        if "reference" in meta["models"]:
            self.ref_rebased = True
        if not checkpoint.restore_rng(root, meta, self.ranks, self.config.seed):
            log.warning("%s: no RNG state for rank %d of %d; reseeding", root, self.rank, self.world_size)
        self.optimizer_steps = int(meta.get("optimizer_steps", 0))
        self.critic_optimizer_steps = int(meta.get("critic_optimizer_steps", 0))
        self.ranks.barrier()
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
