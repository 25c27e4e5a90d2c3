"""Every Ray actor each command starts, declared once: its groups, the Ray bundle of one actor, how many, the phase
in which they are alive, the engines each one builds.

Three readers, one list: the pre-flight check (:mod:`pr_rlhf.resources`, run by every driver right after it joins
Ray), `pr-rlhf plan` (:mod:`pr_rlhf.planning`, which sizes each group's memory) and the drivers (``workers/``), which
reserve placement groups and start actors with the bundles and options read from here. Pure Python: configs only,
no torch, no Ray.

A command's groups, phase by phase (phases run one after the other; the groups of one phase are alive together):

- ``train``: the learner ranks (one placement group, the learner's strategy), the rollout workers (one placement
  group, PACK), the reward pool and the downstream pool;
- ``rl-sweep``: the same once per reward arm, one arm after the other;
- ``pgenrm``: the learner alone for each SFT stage (planner, PSI); the learner, the rollout workers and the engines
  the driver itself runs (teacher, PR judge) for the GRPO stages; the evaluation task; the planner's evaluation
  task; the PSI model's headroom task;
- ``bon``: the rollout workers; then the downstream judge's pool; then each reward model's pool in turn;
- ``train-rm``: the planner in the driver (training rubrics, mode 'plan'); the learner ranks; the evaluation task;
- ``leaderboard``: one training task per embedding method (queued: Ray runs as many as fit); the methods' scoring
  pool; each other reward model's pool in turn; the few-shot curve's service replica;
- ``scaling``: the grid task;
- ``serve-reward``: the service's replicas.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pr_rlhf.configs.base import EngineBase, ScalarRMConfig, engine_config
from pr_rlhf.configs.bon import BoNConfig
from pr_rlhf.configs.leaderboard import LeaderboardConfig
from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.configs.pgenrm import GRPO_STAGES, PGenRMConfig
from pr_rlhf.configs.recipe import Recipe
from pr_rlhf.configs.reward import EngineRef, RewardBase, reward_config
from pr_rlhf.configs.rl import RLConfig
from pr_rlhf.configs.rm import RMTrainConfig
from pr_rlhf.configs.scaling import ScalingEvalConfig
from pr_rlhf.configs.serve import ServeConfig

COMMANDS = ("train", "rl-sweep", "pgenrm", "bon", "train-rm", "leaderboard", "scaling", "serve-reward")
Role = Literal["learner", "rollout", "reward", "task", "replica", "driver"]


def uses_gpu(device: str, cluster_gpus: float) -> bool:
    """The one device rule: whether an actor configured with ``device`` asks Ray for GPUs. ``cuda`` (or
    ``cuda:N``): always. ``auto``: when the cluster has GPUs (the actor then sees its GPU and builds on cuda; on a
    cluster without GPUs it asks for none and builds on the CPU). Anything else: never. `pr-rlhf plan` plans a GPU
    cluster, so there ``auto`` is a GPU; the pre-flight check and the drivers read the cluster they joined."""
    return device.startswith("cuda") or (device == "auto" and cluster_gpus > 0)


def bundle(cpus: float, gpus: float = 0.0, custom: Mapping[str, float] | None = None) -> dict[str, float]:
    """A Ray bundle: ``{"CPU": cpus, "GPU": gpus (only when asked), custom...}``."""
    return {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {}),
            **{k: float(v) for k, v in (custom or {}).items()}}


@dataclass(frozen=True)
class LearnerJob:
    """What a learner group trains, for the plan's memory: its config (``model`` the one trained), the recipe field
    naming that model, the longest sequence and response a rank sees, and whether a frozen reference is built."""

    config: LearnerConfig
    model_field: str
    seq_len: int
    response_len: int
    reference: bool


@dataclass(frozen=True)
class ActorGroup:
    """``count`` actors started alike, each asking Ray for ``bundle``."""

    name: str                             # what errors call the group, e.g. "train.learner", "reward pool"
    actor: str                            # one actor, as the plan labels it: "learner rank", "reward worker"
    role: Role                            # "driver": runs in the job's driver process, not a Ray actor
    bundle: Mapping[str, float]           # {"CPU": .., "GPU": .., custom: ..} of one actor
    count: int
    phase: str                            # groups of one phase are alive together; phases run in turn
    fields: Mapping[str, str]             # resource -> the recipe field that sets it ("*": custom resources)
    placement_group: str | None = None    # its placement-group strategy when reserved as one group
    engines: tuple[EngineRef, ...] = ()   # the engines each actor builds (fields: full recipe paths)
    learner: LearnerJob | None = field(default=None, compare=False)
    queued: bool = False                  # tasks Ray starts as room frees: one at a time is enough
    note: str = ""                        # what the actor does, where no engine says it
    colocated_with: str | None = None     # runs in that group's bundles (one actor per bundle), none of its own
    ask: Mapping[str, float] | None = None   # what one actor asks inside its bundle, when less (a colocated share)

    @property
    def bundles(self) -> tuple[dict[str, float], ...]:
        """One bundle per actor (a placement group's bundles); none for a colocated group."""
        return () if self.colocated_with else tuple(dict(self.bundle) for _ in range(self.count))

    @property
    def gpus(self) -> float:
        return float(self.bundle.get("GPU", 0.0))

    @property
    def engine_gpus(self) -> int:
        """GPUs the widest engine of one actor spans (vLLM tensor parallelism; 0 when all run on the CPU)."""
        return max([ref.gpus for ref in self.engines] + [0])

    def field(self, resource: str | None = None) -> str:
        """The recipe field that sets ``resource`` (None: GPU if the group takes GPUs, else CPU)."""
        if resource is None:
            resource = "GPU" if self.gpus else "CPU"
        return self.fields.get(resource) or self.fields["*"]

    def total(self) -> dict[str, float]:
        """What the group asks for together (a queued group: one actor at a time; a colocated group: nothing
        beyond the bundles of the group it runs in)."""
        if self.colocated_with:
            return {}
        n = 1 if self.queued else self.count
        return {key: value * n for key, value in self.bundle.items()}

    def options(self) -> dict[str, Any]:
        """One actor's Ray options: ``num_cpus``, ``num_gpus`` and, when asked, ``resources`` (inside a bundle
        shared with a colocated group: its own part, ``ask``)."""
        own = self.ask or self.bundle
        custom = {k: v for k, v in own.items() if k not in ("CPU", "GPU")}
        return {"num_cpus": own.get("CPU", 0.0), "num_gpus": own.get("GPU", 0.0),
                **({"resources": custom} if custom else {})}


def _fields(cpu: str, gpu: str | None = None, custom: str | None = None) -> dict[str, str]:
    return {"CPU": cpu, "GPU": gpu or cpu, "*": custom or cpu}


# ---------------------------------------------------------------------------------------------- groups
def learner_group(cfg: LearnerConfig, cluster_gpus: float, where: str = "learner", phase: str = "",
                  job: LearnerJob | None = None, colocated: Mapping[str, float] | None = None) -> ActorGroup:
    """The learner ranks of ``cfg`` (``workers.learner.LearnerGroup``): a GPU share each when :func:`uses_gpu`.
    ``colocated``: the bundle of an actor each rank's bundle also hosts (a colocated rollout engine); the rank
    then asks for the rest of the bundle."""
    gpus = cfg.num_gpus_per_worker if uses_gpu(cfg.device, cluster_gpus) else 0.0
    own = bundle(cfg.num_cpus_per_worker, gpus, cfg.resources)
    shared, ask = own, None
    if colocated:
        shared = {k: own.get(k, 0.0) + colocated.get(k, 0.0) for k in {*own, *colocated} if k != "GPU"}
        shared = bundle(shared.pop("CPU"), gpus, shared)   # the GPU is the rank's: the engine takes a share of it
        ask = {**own, **({"GPU": gpus - colocated.get("GPU", 0.0)} if gpus else {})}
    return ActorGroup(where, "learner rank", "learner", shared, cfg.world_size, phase,
                      _fields(f"{where}.num_cpus_per_worker", f"{where}.num_gpus_per_worker", f"{where}.resources"),
                      placement_group=cfg.placement_strategy, learner=job, ask=ask)


def rollout_group(section: RLConfig | PGenRMConfig | BoNConfig, where: str, engine: EngineBase, engine_field: str,
                  phase: str = "", placement_group: str | None = None,
                  custom: Mapping[str, float] | None = None) -> ActorGroup:
    """The rollout workers of ``section`` (its ``rollout_workers`` / ``rollout_num_cpus`` / ``rollout_num_gpus``, and
    ``custom`` resources), each building ``engine``."""
    return ActorGroup(f"{where}.rollout workers", "rollout worker", "rollout",
                      bundle(section.rollout_num_cpus, section.rollout_num_gpus, custom), section.rollout_workers,
                      phase, _fields(f"{where}.rollout_num_cpus", f"{where}.rollout_num_gpus",
                                     f"{where}.rollout_resources"),
                      placement_group=placement_group, engines=(EngineRef(engine_field, engine, ("rollout",)),))


def learner_and_rollout(section: RLConfig | PGenRMConfig, where: str, lcfg: LearnerConfig, engine: EngineBase,
                        phase: str, cluster_gpus: float, job: LearnerJob, placement_group: str | None = None,
                        custom: Mapping[str, float] | None = None) -> list[ActorGroup]:
    """A section's learner ranks and rollout workers in its ``layout``: split, each group its own bundles; colocated
    (the hybrid engine), each rank's bundle also hosting one engine (:func:`learner_group`'s ``colocated``)."""
    rollout = rollout_group(section, where, engine, f"{where}.rollout", phase, placement_group, custom)
    if section.layout == "colocated":
        rollout = replace(rollout, placement_group=None, colocated_with=f"{where}.learner")
        return [learner_group(lcfg, cluster_gpus, f"{where}.learner", phase, job, colocated=rollout.bundle), rollout]
    return [learner_group(lcfg, cluster_gpus, f"{where}.learner", phase, job), rollout]


def reward_pool_group(reward: RewardBase, where: str = "reward", phase: str = "", actor: str = "reward worker",
                      pool_where: str | None = None) -> ActorGroup:
    """The workers of a reward pool (``workers.reward.RewardPool``), each building ``reward.engines()``.
    ``pool_where``: the recipe path of its pool (default ``<where>.pool``)."""
    pool, at = reward.pool, pool_where or f"{where}.pool"
    return ActorGroup(f"{where} pool", actor, "reward", bundle(pool.num_cpus, pool.num_gpus, pool.resources),
                      pool.workers, phase, _fields(f"{at}.num_cpus", f"{at}.num_gpus", f"{at}.resources"),
                      engines=tuple(ref.at(where) for ref in reward.engines()), note=f"{reward.kind} scorer")


def replica_group(serve: ServeConfig, where: str = "serve", phase: str = "serve", actor: str = "replica") -> ActorGroup:
    """The replicas of a reward service (``workers.reward_service.deploy``) for its ``ServeConfig``."""
    return ActorGroup(f"{where} replicas", actor, "replica", bundle(serve.num_cpus, serve.num_gpus), serve.replicas,
                      phase, _fields(f"{where}.num_cpus", f"{where}.num_gpus"),
                      engines=tuple(ref.at(f"{where}.reward") for ref in serve.reward.engines()),
                      note=f"{serve.reward.kind} scorer")


def _task(name: str, actor: str, phase: str, task_bundle: dict[str, float], fields: dict[str, str],
          engines: Sequence[EngineRef] = (), count: int = 1, note: str = "") -> ActorGroup:
    return ActorGroup(name, actor, "task", task_bundle, count, phase, fields, engines=tuple(engines),
                      queued=count > 1, note=note)


def _driver(actor: str, phase: str, engines: Sequence[EngineRef]) -> ActorGroup:
    """Engines the job's driver itself builds: no Ray bundle (its GPUs come with the job's submission)."""
    return ActorGroup(actor, actor, "driver", {"CPU": 0.0}, 1, phase, _fields("<job entrypoint>"),
                      engines=tuple(engines))


# ---------------------------------------------------------------------------------------------- commands
def train_groups(train: RLConfig, reward: RewardBase, reward_where: str, phase: str, cluster_gpus: float
                 ) -> list[ActorGroup]:
    """One RL run (``workers.controller.RLController``): ``train`` its RLConfig, ``reward`` the pool's scorer."""
    lcfg = train.learner
    job = LearnerJob(lcfg, "train.learner.model", train.rollout.max_model_len, train.max_tokens, lcfg.kl.coef > 0)
    groups = [*learner_and_rollout(train, "train", lcfg, train.rollout, phase, cluster_gpus, job, "PACK",
                                   train.rollout_resources),
              reward_pool_group(reward, reward_where, phase)]
    if train.downstream is not None:
        groups.append(reward_pool_group(train.downstream, "train.downstream", phase, "downstream worker"))
    return groups


def pgenrm_groups(cfg: PGenRMConfig, cluster_gpus: float) -> list[ActorGroup]:
    """`pr-rlhf pgenrm` (``workers.pgenrm``)."""
    groups: list[ActorGroup] = []
    grpo = [s for s in cfg.stages if s in GRPO_STAGES]
    response = max([cfg.stage_config(s).max_tokens for s in grpo] + [cfg.eval.max_tokens])
    seq = cfg.rollout.max_model_len

    def learner(model: str, model_field: str, phase: str, reference: bool) -> ActorGroup:
        lcfg = cfg.learner.model_copy(update={"model": model})
        return learner_group(lcfg, cluster_gpus, "pgenrm.learner", phase,
                             LearnerJob(lcfg, model_field, seq, response, reference))

    for stage in [s for s in cfg.stages if s == "planner" or (s == "psi" and cfg.psi.steps > 0)]:
        model, model_field = ((cfg.planner.model, "pgenrm.planner.model") if stage == "planner" else
                              (cfg.model, "pgenrm.model"))
        groups.append(learner(model, model_field, f"pgenrm {stage} (SFT)", False))
    if grpo:
        phase = f"pgenrm GRPO ({', '.join(grpo)})"
        lcfg = cfg.learner.model_copy(update={"model": cfg.model})
        job = LearnerJob(lcfg, "pgenrm.model", seq, response, max(cfg.stage_config(s).kl.coef for s in grpo) > 0)
        groups += learner_and_rollout(cfg, "pgenrm", lcfg, cfg.rollout.model_copy(update={"model": cfg.model}),
                                      phase, cluster_gpus, job)
        in_driver = [EngineRef(f, e) for e, f in ((cfg.psi.teacher, "pgenrm.psi.teacher"),
                                                  (cfg.pr_judge, "pgenrm.pr_judge"))
                     if isinstance(e, EngineBase) and e.backend != "openai"]
        if in_driver:
            groups.append(_driver("driver engines", phase, in_driver))
    if any(s != "planner" for s in cfg.stages):
        res = cfg.eval_resources()
        on_rollout = cfg.eval.engine == "rollout"
        fields = (_fields("pgenrm.rollout_num_cpus", "pgenrm.rollout_num_gpus", "pgenrm.eval.engine") if on_rollout
                  else _fields("pgenrm.eval.engine"))
        engine = EngineRef("pgenrm.rollout" if on_rollout else "pgenrm.eval", cfg.eval_engine(cfg.model))
        groups.append(_task("pgenrm evaluation task", "evaluation task", "pgenrm evaluation",
                            bundle(res["num_cpus"], res.get("num_gpus", 0.0)), fields, [engine]))
    if "planner" in cfg.stages:
        engine = EngineRef("pgenrm.planner", engine_config(backend="hf", model=cfg.planner.model))
        groups.append(_task("pgenrm planner evaluation task", "planner evaluation task",
                            "pgenrm planner evaluation", bundle(1), _fields("pgenrm.planner"), [engine]))
    if "psi" in cfg.stages and cfg.psi.source == "world" and cfg.headroom.after_psi:   # real data: no world
        engine = EngineRef("pgenrm", engine_config(backend="hf", model=cfg.model,
                                                   max_model_len=cfg.rollout.max_model_len))
        groups.append(_task("pgenrm headroom task", "headroom task", "pgenrm headroom", bundle(1),
                            _fields("pgenrm.headroom"), [engine]))
    return groups


def bon_groups(cfg: BoNConfig) -> list[ActorGroup]:
    """`pr-rlhf bon` (``workers.bon.BoNSweep``): the pool generated, then scored by the downstream judge, then by
    each reward model, one pool after the other."""
    groups = [rollout_group(cfg, "bon", cfg.policy, "bon.policy", "bon generate"),
              reward_pool_group(cfg.downstream, "bon.downstream", "bon score downstream", "downstream worker")]
    for name, reward in cfg.reward_models.items():
        groups.append(reward_pool_group(reward, f"bon.reward_models.{name}", f"bon score {name}", f"{name} worker"))
    return groups


def rm_eval_scalar_rm(cfg: RMTrainConfig) -> ScalarRMConfig:
    """The scalar RM a `pr-rlhf train-rm` evaluation task scores with (``workers.rm_training.eval_recipe``)."""
    ecfg = cfg.eval
    return ScalarRMConfig(model=cfg.model, max_length=cfg.max_length, batch_size=ecfg.batch_size,
                          device=ecfg.device, dtype=ecfg.dtype)


def rm_eval_task(cfg: RMTrainConfig, cluster_gpus: float, plan_mode: bool = False) -> ActorGroup:
    """The task that evaluates one mode's RM: one CPU, one GPU when ``rm.eval.device`` says so; its scalar RM and,
    for mode 'plan', the planner."""
    planner = [EngineRef("rm.planner", cfg.planner)] if plan_mode and cfg.planner is not None else []
    return _task("rm evaluation task", "rm eval task", f"rm evaluation ({'plan' if plan_mode else 'other modes'})",
                 bundle(1, 1 if uses_gpu(cfg.eval.device, cluster_gpus) else 0), _fields("rm.eval.device"),
                 [EngineRef("rm", rm_eval_scalar_rm(cfg)), *planner])


def rm_learner_group(cfg: RMTrainConfig, cluster_gpus: float, where: str, phase: str) -> ActorGroup:
    """The learner ranks that train a Bradley-Terry RM (``workers.rm_training.RMTrainer``); ``where``: the recipe
    path of the rm section."""
    lcfg = cfg.learner.model_copy(update={"model": cfg.model})
    return learner_group(lcfg, cluster_gpus, f"{where}.learner", phase,
                         LearnerJob(lcfg, f"{where}.model", cfg.max_length, 0, False))


def rm_groups(cfg: RMTrainConfig, cluster_gpus: float) -> list[ActorGroup]:
    """`pr-rlhf train-rm` (``workers.rm_training.RMTrainer``)."""
    groups: list[ActorGroup] = []
    if "plan" in cfg.input_modes and cfg.planner is not None and cfg.planner.backend != "openai":
        groups.append(_driver("driver (rm.planner)", "rm planner (training rubrics)",
                              [EngineRef("rm.planner", cfg.planner)]))
    groups.append(rm_learner_group(cfg, cluster_gpus, "rm", "rm training"))
    if set(cfg.input_modes) - {"plan"}:
        groups.append(rm_eval_task(cfg, cluster_gpus))
    if "plan" in cfg.input_modes:
        groups.append(rm_eval_task(cfg, cluster_gpus, plan_mode=True))
    return groups


LEADERBOARD_SERVICE_CPUS = 1.0   # the few-shot curve's one service replica (an embedding model on the CPU)


def leaderboard_model_reward(cfg: LeaderboardConfig, name: str, world: int | None = None) -> RewardBase:
    """The reward config of the leaderboard's model row ``name``: its own, on the leaderboard's pool unless it
    sets one (``workers.leaderboard``), ``{world}`` in its strings replaced by ``world`` (a model trained per
    world; left as written when no world is given, as in the pre-flight check)."""
    return reward_config(**{"pool": cfg.pool.model_dump(), **with_world(cfg.models[name].reward, world)})


def with_world(value: Any, world: int | None) -> Any:
    """``value`` (a config's nested dicts, lists and strings) with ``{world}`` in its strings replaced."""
    if world is None:
        return value
    if isinstance(value, str):
        return value.replace("{world}", str(world))
    if isinstance(value, dict):
        return {k: with_world(v, world) for k, v in value.items()}
    if isinstance(value, list):
        return [with_world(v, world) for v in value]
    return value


def persona_book_beside(model_dir: str | Path) -> str:
    """Where a BT RM trained in input mode 'persona' keeps the personas it was trained with: beside its model
    folder (``workers.rm_training.RMTrainer`` writes it, the ``persona`` kind scoring the RM reads it)."""
    return str(Path(model_dir).parent / "personas.json")


def leaderboard_bt_reward(cfg: LeaderboardConfig, mode: str, model_dir: str = "<world>/bt_rm/<mode>/model"
                          ) -> RewardBase:
    """The reward a fine-tuned BT RM of the leaderboard (``bt_rm``) is scored with: the scalar RM trained in input
    mode ``mode`` (``model_dir``: its world's folder; the pre-flight check sizes the engine without one), read as
    `pr-rlhf train-rm`'s evaluation reads it, on the leaderboard's pool. Mode 'persona': the ``persona`` kind
    (``bt_rm.persona``) with the RM as its reader and the persona book the RM was trained with beside its model."""
    bt = cfg.bt_rm
    scalar_rm = rm_eval_scalar_rm(bt).model_copy(update={"model": model_dir}).model_dump()
    if mode == "persona":
        return reward_config(**{**bt.persona.model_dump(), "pool": cfg.pool.model_dump(), "scalar_rm": scalar_rm,
                                "personas": persona_book_beside(model_dir)})
    return reward_config(kind="scalar", input_mode=mode, top_k_profile=bt.top_k_profile, pool=cfg.pool.model_dump(),
                         scalar_rm=scalar_rm)


def leaderboard_groups(cfg: LeaderboardConfig, cluster_gpus: float = 0.0) -> list[ActorGroup]:
    """`pr-rlhf leaderboard` (``workers.leaderboard.Leaderboard``)."""
    groups = [_task("leaderboard training task", "training task", "leaderboard training", bundle(1),
                    _fields("leaderboard.methods"), count=len(cfg.methods), note="embedding method on the CPU"),
              ActorGroup("leaderboard pool", "reward worker", "reward",
                         bundle(cfg.pool.num_cpus, cfg.pool.num_gpus, cfg.pool.resources), cfg.pool.workers,
                         "leaderboard scoring", _fields("leaderboard.pool.num_cpus", "leaderboard.pool.num_gpus",
                                                        "leaderboard.pool.resources"), note="embedding scorer")]
    for name, row in cfg.models.items():
        where = f"leaderboard.models.{name}.reward"
        groups.append(reward_pool_group(leaderboard_model_reward(cfg, name), where, f"leaderboard score {name}",
                                        f"{name} worker", None if "pool" in row.reward else "leaderboard.pool"))
    if cfg.bt_rm is not None:
        persona = cfg.bt_rm.persona
        if "persona" in cfg.bt_rm.input_modes and persona is not None and persona.judge.backend != "openai":
            groups.append(_driver("driver (leaderboard.bt_rm.persona)", "leaderboard bt personas (training users)",
                                  [EngineRef("leaderboard.bt_rm.persona.judge", persona.judge)]))
        groups.append(rm_learner_group(cfg.bt_rm, cluster_gpus, "leaderboard.bt_rm", "leaderboard bt training"))
        for mode in cfg.bt_rm.input_modes:
            groups.append(reward_pool_group(leaderboard_bt_reward(cfg, mode), "leaderboard.bt_rm",
                                            f"leaderboard score bt_{mode}", f"bt_{mode} worker", "leaderboard.pool"))
    if cfg.few_shot is not None and cfg.few_shot.service:
        groups.append(ActorGroup("leaderboard few-shot service", "service replica", "replica",
                                 bundle(LEADERBOARD_SERVICE_CPUS), 1, "leaderboard few-shot service",
                                 _fields("leaderboard.few_shot.service"), note="embedding scorer"))
    return groups


def scaling_groups(cfg: ScalingEvalConfig) -> list[ActorGroup]:
    """`pr-rlhf scaling` (``workers.scaling``): the grid in one task holding a CPU per torch thread it runs."""
    engine = EngineRef("scaling", engine_config(backend="hf", model=cfg.model))
    return [_task("scaling grid task", "grid task", "scaling grid", bundle(cfg.torch_threads),
                  _fields("scaling.torch_threads"), [engine])]


def declare(recipe: Recipe, command: str, cluster_gpus: float = 0.0) -> list[ActorGroup]:
    """Every actor group ``command`` (one of :data:`COMMANDS`) starts for ``recipe``, phase by phase.
    ``cluster_gpus``: the cluster's GPUs (:func:`uses_gpu`)."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r} (one of {COMMANDS})")
    section_name = {"train": "train", "rl-sweep": "train", "pgenrm": "pgenrm", "bon": "bon", "train-rm": "rm",
                    "leaderboard": "leaderboard", "scaling": "scaling", "serve-reward": "serve"}[command]
    section = getattr(recipe, section_name)
    if section is None:
        raise ValueError(f"the recipe has no {section_name}: section")
    if command == "train":
        return train_groups(section, recipe.reward, "reward", "train", cluster_gpus)
    if command == "rl-sweep":
        if recipe.rl_sweep is None:
            raise ValueError("the recipe has no rl_sweep: section")
        return [g for arm, reward in recipe.rl_sweep.arms.items()
                for g in train_groups(section, reward, f"rl_sweep.arms.{arm}", f"rl-sweep arm {arm}", cluster_gpus)]
    if command == "pgenrm":
        return pgenrm_groups(section, cluster_gpus)
    if command == "bon":
        return bon_groups(section)
    if command == "train-rm":
        return rm_groups(section, cluster_gpus)
    if command == "leaderboard":
        return leaderboard_groups(section, cluster_gpus)
    if command == "scaling":
        return scaling_groups(section)
    return [replica_group(section)]


def commands_of(recipe: Recipe) -> list[str]:
    """The commands that start actors for ``recipe``'s sections (``train`` with ``rl_sweep``: the sweep)."""
    out = [] if recipe.train is None else ["rl-sweep" if recipe.rl_sweep is not None else "train"]
    return out + [command for command, section in (("pgenrm", recipe.pgenrm), ("bon", recipe.bon),
                                                   ("train-rm", recipe.rm), ("leaderboard", recipe.leaderboard),
                                                   ("scaling", recipe.scaling), ("serve-reward", recipe.serve))
                  if section is not None]


def phases(groups: Sequence[ActorGroup]) -> dict[str, list[ActorGroup]]:
    """The groups by phase, in the order the phases run."""
    out: dict[str, list[ActorGroup]] = {}
    for g in groups:
        out.setdefault(g.phase, []).append(g)
    return out


def cpus_needed(groups: Sequence[ActorGroup]) -> float:
    """The most logical CPUs the Ray actors of one phase ask for together (what a local Ray must offer)."""
    return max([sum(g.total().get("CPU", 0.0) for g in members if g.role != "driver")
                for members in phases(groups).values()] + [0.0])

