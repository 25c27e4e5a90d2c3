"""RolloutWorker: one generation engine (``hf`` or ``vllm``, from an :class:`~pr_rlhf.configs.recipe.EngineConfig`) in
a Ray actor, with in-place weight updates for RL.

- ``generate(prompts, params)`` -> one :class:`~pr_rlhf.models.base.Generation` per prompt (``params.n`` samples
  each, with token ids, and per-token log-probabilities when ``params.logprobs``).
- ``receive_weights(buckets)`` takes new policy weights from the learner over the weight-update group
  (``pr_rlhf.models.weight_sync``; joined once with ``join_weight_group``), in place (vLLM: through the worker
  extension in every tensor-parallel worker, then a prefix-cache reset), and bumps ``weights_version``;
  generations made after it use the new weights. ``load_weights(state_dict)`` does the same from a state dict
  (the earlier path, which bench/weight_sync.py keeps as its baseline). Pass ``version`` to set the counter to the
  learner's step instead of incrementing it.

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
        if cfg.backend == "vllm" and not cfg.device.startswith("cuda"):
            # In-place reload needs the engine in this process (vLLM's default spawns an engine-core process),
            # unless the caller's env says otherwise.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.cfg = cfg
        self.engine = make_engine(cfg)
        self.weights_version = 0

    def ready(self) -> dict[str, Any]:
        """Returns once the engine is built (actor creation is asynchronous)."""
        from workers.ray_utils import current_node_id

        return {"backend": self.cfg.backend, "model": self.cfg.model, "pid": os.getpid(),
                "weights_version": self.weights_version, "node_id": current_node_id()}

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        return self.engine.generate(list(prompts), params)

    def load_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> int:
        """Load new weights in place; returns the new ``weights_version``."""
        self.engine.load_weights(state_dict)
        self.weights_version = self.weights_version + 1 if version is None else int(version)
        return self.weights_version

    # the weight-update group (pr_rlhf.models.weight_sync; LearnerGroup.push_weights drives it)
    def weight_receivers(self) -> tuple[int, str]:
        """(processes that receive in this engine, the dtype they take)."""
        return self.engine.weight_receivers(), self.cfg.dtype

    def join_weight_group(self, host: str, port: int, first_rank: int, world_size: int, backend: str) -> None:
        self.engine.join_weight_group(host, port, first_rank, world_size, backend)

    def receive_weights(self, buckets: list, version: int | None = None) -> int:
        """The learner's broadcast, in place; returns the new ``weights_version``."""
        self.engine.receive_weights(buckets)
        self.weights_version = self.weights_version + 1 if version is None else int(version)
        return self.weights_version

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
