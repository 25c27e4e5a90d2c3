"""RolloutWorker: one generation engine (``hf`` or ``vllm``, from an :class:`~pr_rlhf.configs.recipe.EngineConfig`) in
a Ray actor, with in-place weight updates for RL.

- ``generate(prompts, params)`` -> one :class:`~pr_rlhf.models.base.Generation` per prompt (``params.n`` samples
  each, with token ids, and per-token log-probabilities when ``params.logprobs``).
- vLLM's weight-transfer calls (``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
  ``finish_weight_update``, ``shutdown_weight_transfer_engine``), driven by learner rank 0
  (``workers.learner.weight_transfer``); ``finish_weight_update(version)`` commits the update and sets
  ``weights_version`` to the learner's step. A vLLM engine runs vLLM's multiprocess runtime (its engine core and
  tensor-parallel workers in processes of their own), as on a GPU cluster.
- ``load_weights(state_dict)`` (hf only): a state dict through the object store, the earlier path that only
  ``bench/weight_sync.py`` runs, as its baseline.

On CPU, vLLM torch-compiles a small kernel on the first request that asks for logprobs (~15 s cold, a few s
with a warm inductor cache); ``env={"TORCH_COMPILE_DISABLE": "1"}`` runs it eagerly instead (what the tests do).

Create it with :func:`spawn_rollout_worker` (or ``ray.remote(RolloutWorker).options(...).remote(cfg)``); the class
itself is plain Python, so it also runs in-process.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pr_rlhf.configs.base import EngineBase, EngineConfig, engine_config
from pr_rlhf.models import Generation, Prompt, SamplingParams, make_engine

ROLLOUT_BACKENDS = ("hf", "vllm")


class RolloutWorker:
    def __init__(self, cfg: EngineConfig | Mapping[str, Any], env: Mapping[str, str] | None = None) -> None:
        cfg = cfg if isinstance(cfg, EngineBase) else engine_config(**cfg)
        if cfg.backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"a rollout worker needs a local engine ({' or '.join(ROLLOUT_BACKENDS)}), "
                             f"not {cfg.backend!r}: weights cannot be pushed to an HTTP server")
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        if "OMP_NUM_THREADS" in (env or {}):   # torch is imported already: the variable alone would not apply

            from pr_rlhf.threads import set_torch_threads

            set_torch_threads(int(env["OMP_NUM_THREADS"]))
        self.cfg = cfg
        self.engine = make_engine(cfg)
        self.weights_version = 0

    def ready(self) -> dict[str, Any]:
        """Returns once the engine is built (actor creation is asynchronous)."""
        from workers.ray_utils import current_node_id

        return {"backend": self.cfg.backend, "model": self.cfg.model, "pid": os.getpid(),
                "weights_version": self.weights_version, "node_id": current_node_id()}

    def engine_processes(self) -> dict[str, Any]:
        """This actor's pid and the pids of vLLM's engine core (vLLM engines; empty when it runs in-process)."""
        cores = self.engine.engine_core_pids() if hasattr(self.engine, "engine_core_pids") else []
        return {"actor": os.getpid(), "engine_core": cores}

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        return self.engine.generate(list(prompts), params)

    def load_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> int:
        """(hf) Load a state dict in place; returns the new ``weights_version``."""
        self.engine.load_weights(state_dict)
        self.weights_version = self.weights_version + 1 if version is None else int(version)
        return self.weights_version

    # vLLM's weight-transfer API (learner rank 0 drives it: workers.learner.weight_transfer.RolloutClient)
    def weight_receivers(self) -> tuple[int, str, str]:
        """(processes that receive in this engine, the dtype they take, the transfer backend)."""
        return self.engine.weight_receivers()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.engine.init_weight_transfer_engine(init_info)

    def start_weight_update(self) -> None:
        self.engine.start_weight_update()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.engine.update_weights(update_info)

    def finish_weight_update(self, version: int | None = None) -> int:
        """Commit the update; returns the new ``weights_version`` (the learner's step when given)."""
        self.engine.finish_weight_update()
        self.weights_version = self.weights_version + 1 if version is None else int(version)
        return self.weights_version

    def abort_weight_update(self) -> None:
        """End an update that failed (the engine holds its previous weights again); the version stays."""
        self.engine.abort_weight_update()

    def shutdown_weight_transfer_engine(self) -> None:
        self.engine.shutdown_weight_transfer_engine()

    def sleep(self, level: int = 1) -> None:
        """Free the device for a colocated learner's update (vLLM's sleep; a no-op on CPU)."""
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    def get_weights_version(self) -> int:
        return self.weights_version

    def close(self) -> None:
        self.engine.close()


def spawn_rollout_worker(cfg: EngineConfig, *, num_cpus: float = 1.0, num_gpus: float = 0.0,
                         env: Mapping[str, str] | None = None, **options: Any) -> Any:
    """A :class:`RolloutWorker` actor (Ray must be initialized). ``env`` is applied inside the actor before the
    engine is built (e.g. ``VLLM_CPU_KVCACHE_SPACE``); ``options`` go to ``.options()``."""
    import ray

    actor_cls = ray.remote(RolloutWorker)
    return actor_cls.options(num_cpus=num_cpus, num_gpus=num_gpus, **options).remote(cfg, env=dict(env or {}))
