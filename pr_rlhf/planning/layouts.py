"""`pr-rlhf plan`'s two layouts of an RL run (``train.layout``; the P-GenRM GRPO stages' ``pgenrm.layout``): split
(rollout engines on GPUs of their own) and colocated (one engine on each learner rank's GPU, asleep during the
update), each planned on the cluster given, with per phase the GPUs busy, the memory per GPU at the phase's peak and
an estimated time, and the layout the plan would choose.

The times are estimates from stated assumptions, not measurements: decoding is memory-bound (each decode step of an
engine reads its weights once for the whole batch), the update is compute-bound (6 FLOPs per parameter and token for
forward and backward, 2 for each extra forward: the proximal log-probs, the reference, the critic's values), the
colocated engine's sleep level 1 moves its weights to host memory and back over PCIe, and its weight transfer is
staged through host memory (gloo); the split layout's goes over NVLink or the network (``sync_line``). The reward is
scored on its own pool in both layouts: its time enters the step alike, its GPUs stay out of the layout's count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pr_rlhf.configs.base import ScalarRMConfig
from pr_rlhf.configs.recipe import Recipe
from pr_rlhf.planning.models import DTYPE_BYTES, GIB, Models
from pr_rlhf.planning.placement import NVLINK_GB_S

HBM_GB_S = 3350.0          # an H100 SXM's memory bandwidth
DECODE_EFFICIENCY = 0.5    # share of it a decode step reaches (KV reads, kernel launches)
PEAK_TFLOPS = 989.0        # bf16 dense, H100 SXM
MFU = 0.35                 # share of it an FSDP2 update reaches
PCIE_GB_S = 25.0           # host <-> GPU, one direction
DECODE_BATCH = 256         # sequences one engine decodes together
PROMPT_SHARE = 0.5         # a sequence's mean length, as a share of rollout.max_model_len
ASSUMPTIONS = (f"decode memory-bound at {DECODE_EFFICIENCY:g} x {HBM_GB_S:g} GB/s, {DECODE_BATCH} sequences per "
               f"engine batch; update at {MFU:g} x {PEAK_TFLOPS:g} TFLOPS (6 FLOPs per parameter and token, +2 per "
               f"extra forward, +8 a critic); sequences of {PROMPT_SHARE:g} x rollout.max_model_len tokens; "
               f"reward: a generating engine decodes generation.max_tokens per sample and role like the rollout, a "
               f"scalar RM one forward per sample (2 FLOPs per parameter and token), on the reward pool's GPUs; "
               f"colocated: sleep level 1 moves the weights over PCIe ({PCIE_GB_S:g} GB/s) both ways, the transfer "
               f"staged through host memory; split: the transfer at {NVLINK_GB_S:g} GB/s; layout variants: colocated "
               "one engine per rank with 0.4 of its GPU, split one engine per two ranks (pr_rlhf/planning/layouts.py)")


@dataclass
class LayoutEstimate:
    layout: str
    fits: bool
    problems: list[str]
    gpus: float                        # GPUs the run holds (learner, rollout; the reward pool apart)
    phases: dict[str, tuple[float, float, float]]   # phase -> (GPUs busy, GiB per GPU at its peak, seconds)
    step_s: float
    samples: int

    @property
    def utilization(self) -> float:
        """GPU-seconds spent generating or updating over the GPU-seconds held in a step."""
        busy = sum(self.phases[p][0] * self.phases[p][2] for p in ("rollout", "update"))
        return busy / (self.gpus * self.step_s) if self.gpus and self.step_s else 0.0

    @property
    def samples_per_gpu_s(self) -> float:
        return self.samples / (self.gpus * self.step_s) if self.gpus and self.step_s else 0.0


@dataclass
class RLSection:
    """What the layouts are estimated from, for each section of a recipe that runs a rollout: the RL run's
    ``train:`` or the P-GenRM GRPO stages' ``pgenrm:`` (one stage's sizes; the others share the layout; their
    reward is computed from the pair's labels, no model)."""

    title: str              # its heading in the plan's output
    phase: str              # how the plan's phase of it begins ("train", "pgenrm GRPO")
    section: str            # the recipe's section holding the layout fields
    config: Any             # that section (RolloutLayout fields, learner, rollout)
    samples: int            # samples per step
    max_tokens: int
    extra_forwards: int     # forwards beside the update's: the proximal log-probs, the reference
    critic: bool
    rollout_mode: str
    reward: Any = None      # the reward config its samples are scored with (None: a reward read from labels)


def rl_sections(recipe: Recipe) -> list[RLSection]:
    """Each section of ``recipe`` whose rollout runs on GPUs (a layout to choose)."""
    out = []
    train = recipe.train
    if train is not None and train.rollout_num_gpus > 0:
        lcfg = train.learner
        samples = train.prompts_per_step * train.group_size
        out.append(RLSection("train", "train", "train", train, samples, train.max_tokens,
                             (not lcfg.single_update(samples)) + (lcfg.kl.coef > 0), lcfg.critic.enabled,
                             train.rollout_mode, recipe.reward))
    pg = recipe.pgenrm
    stages = [s for s in (pg.stages if pg is not None else []) if s in ("cre", "curriculum", "control")]
    if pg is not None and pg.rollout_num_gpus > 0 and stages:
        stage = pg.stage_config(stages[0])
        samples = stage.prompts_per_step * stage.group_size
        out.append(RLSection(f"pgenrm GRPO ({stages[0]})", "pgenrm GRPO", "pgenrm", pg, samples, stage.max_tokens,
                             (not pg.learner.single_update(samples)) + (stage.kl.coef > 0), False, "sync"))
    return out


def variant(recipe: Recipe, rl: RLSection, layout: str) -> Recipe:
    """The recipe with ``rl``'s section in ``layout``: as written when it is already; colocated, one engine per
    learner rank taking 0.4 of its GPU; split from colocated, one engine per two ranks on a GPU of its own
    (``tensor_parallel_size`` GPUs)."""
    cfg = rl.config
    if cfg.layout == layout:
        return recipe
    if layout == "colocated":
        update = {"layout": "colocated", "rollout_workers": cfg.learner.world_size,
                  "rollout_num_gpus": 0.4 if cfg.rollout_num_gpus else 0.0}
        if rl.section == "train":
            update["rollout_mode"] = "sync"
    else:
        update = {"layout": "split", "rollout_workers": max(1, cfg.learner.world_size // 2),
                  "rollout_num_gpus": float(getattr(cfg.rollout, "tensor_parallel_size", 1))
                  if cfg.rollout_num_gpus else 0.0}
    return recipe.model_copy(update={rl.section: cfg.model_copy(update=update)})


def estimate(recipe: Recipe, layout: str, plan_of, models: Models, rl: RLSection | None = None) -> LayoutEstimate:
    """``rl`` (default: the recipe's first section with a GPU rollout) in ``layout``; ``plan_of(recipe)``:
    :func:`pr_rlhf.planning.placement.make_plan` on the cluster given."""
    rl = rl or rl_sections(recipe)[0]
    run = variant(recipe, rl, layout)
    cfg = getattr(run, rl.section)
    plan = plan_of(run)
    phase = next(p for p in plan.phases if p.phase.name.startswith(rl.phase)
                 and any(x.actor.name.startswith("learner rank") for x in p.placed))
    learners = [p.actor for p in phase.placed if p.actor.name.startswith("learner rank")]
    engines = [p.actor for p in phase.placed if p.actor.name.startswith("rollout worker")]
    arch = models.get(cfg.learner.model)
    params = arch.params() if arch else 0.0
    b = DTYPE_BYTES.get(getattr(cfg.rollout, "dtype", "bfloat16"), 2)
    tp = getattr(cfg.rollout, "tensor_parallel_size", 1)
    n_engines = cfg.rollout_workers
    batches = math.ceil(rl.samples / n_engines / DECODE_BATCH)
    rollout_s = rl.max_tokens * batches * (b * params / tp) / (HBM_GB_S * 1e9 * DECODE_EFFICIENCY)
    tokens = rl.samples * PROMPT_SHARE * cfg.rollout.max_model_len
    flops = params * tokens * (6 * cfg.learner.ppo_epochs + 2 * rl.extra_forwards + 8 * rl.critic)
    learner_gpus = sum(a.gpus for a in learners)
    update_s = flops / (max(learner_gpus, 1) * PEAK_TFLOPS * 1e12 * MFU)
    weights = b * params * n_engines
    colocated = layout == "colocated"
    sync_s = weights / ((PCIE_GB_S if colocated else NVLINK_GB_S) * 1e9) * (2 if colocated else 1)
    sleep_s = 2 * b * params / (PCIE_GB_S * 1e9) if colocated and cfg.sleep_level == 1 else 0.0
    if colocated:
        roll_mem = max((a.phase_bytes.get("rollout", 0.0) for a in learners), default=0.0) / GIB
        upd_mem = max((a.phase_bytes.get("update", 0.0) for a in learners), default=0.0) / GIB
        gpus, rollout_gpus = learner_gpus, learner_gpus
    else:
        roll_mem = max((a.gpu_bytes for a in engines), default=0.0) / GIB
        upd_mem = max((a.gpu_bytes for a in learners), default=0.0) / GIB
        rollout_gpus = sum(max(a.gpus, tp) if a.gpus else 0.0 for a in engines)
        gpus = learner_gpus + rollout_gpus
    reward = reward_phase(rl, [p.actor for p in phase.placed if p.actor.name.startswith("reward worker")], models)
    phases = {"rollout": (rollout_gpus, roll_mem, rollout_s), "reward": reward,
              "update": (learner_gpus, upd_mem, update_s), "sync": (gpus, 0.0, sync_s + sleep_s)}
    step = rollout_s + reward[2] + update_s + sync_s + sleep_s
    if getattr(cfg, "rollout_mode", "sync") == "one_step_off":   # the next batch is generated meanwhile
        step = max(rollout_s, reward[2] + update_s) + sync_s
    return LayoutEstimate(layout, plan.fits, plan.problems, gpus, phases, step, rl.samples)


def reward_phase(rl: RLSection, workers: list, models: Models) -> tuple[float, float, float]:
    """(GPUs, GiB per GPU, seconds) of scoring a step's samples on the reward pool ``workers``, the same in both
    layouts: each generating engine writes ``generation.max_tokens`` per sample and role (a judge that also plans:
    two), decode-bound like the rollout; a scalar RM reads each sample once, compute-bound. A reward on CPU or from
    labels takes no GPU and is not timed."""
    gpus = sum(a.gpus for a in workers)
    if rl.reward is None or not gpus:
        return 0.0, 0.0, 0.0
    seconds = 0.0
    for ref in rl.reward.engines():
        cfg = ref.config
        arch = models.get(cfg.model)
        if arch is None or not getattr(cfg, "device", "cpu").startswith("cuda"):
            continue
        if isinstance(cfg, ScalarRMConfig):            # one forward per sample
            tokens = rl.samples * PROMPT_SHARE * cfg.max_length
            seconds += 2 * arch.params() * tokens / (gpus * PEAK_TFLOPS * 1e12 * MFU)
        elif cfg.backend == "vllm":
            b = DTYPE_BYTES.get(cfg.dtype, 2)
            batches = math.ceil(rl.samples * max(len(ref.roles), 1) / len(workers) / DECODE_BATCH)
            seconds += (rl.reward.generation.max_tokens * batches * b * arch.params() / cfg.tensor_parallel_size
                        / (HBM_GB_S * 1e9 * DECODE_EFFICIENCY))
    return gpus, max(a.gpu_bytes for a in workers) / GIB, seconds


def choose(estimates: list[LayoutEstimate]) -> tuple[LayoutEstimate | None, str]:
    """The layout that fits with the most samples per GPU-second, and why in one sentence."""
    fitting = [e for e in estimates if e.fits]
    if not fitting:
        return None, "neither layout fits this cluster"
    best = max(fitting, key=lambda e: e.samples_per_gpu_s)
    others = [e for e in estimates if e is not best]
    why = "; ".join(f"{e.layout} {'does not fit' if not e.fits else f'{e.samples_per_gpu_s:.3g} samples/s per GPU'}"
                    for e in others)
    return best, (f"{best.layout}: {best.samples_per_gpu_s:.3g} samples/s per GPU on {best.gpus:g} GPUs, "
                  f"{best.utilization:.0%} of their time busy ({why})")
