"""``LearnerGroup``: ``world_size`` ``LearnerWorker`` actors in one placement group, driven together (driver side).

It wires ``MASTER_ADDR`` / ``MASTER_PORT`` / ``RANK`` / ``WORLD_SIZE`` and fans every call out to the ranks:
inference calls split the batch into contiguous per-rank chunks and concatenate the results in order; updates
split each global mini-batch (``mini_batch_size`` samples, in batch order) across the ranks, so a step sees the
same samples whatever the world size (``pr_rlhf.rl.batches``). Needs ``ray.init()`` first.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import torch

from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.rl.batches import collate, contiguous_shares, mini_batch_shares, reward_model_batch, scored_rows
from workers.learner.worker import LearnerWorker
from workers.ray_utils import release_bundles, reserve_bundles

if TYPE_CHECKING:  # pragma: no cover
    from typing import Self


class LearnerGroup:
    """``world_size`` ``LearnerWorker`` actors in one placement group, driven together."""

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

    def _call_each(self, method: str, shares: list[dict[str, torch.Tensor]], *args: Any) -> list[Any]:
        """``method(share_r, *args)`` on rank r, for every rank."""
        import ray

        return ray.get([getattr(w, method).remote(share, *args) for w, share in zip(self.workers, shares)])

    def _inference(self, method: str, batch: Mapping[str, Any]) -> torch.Tensor:
        return torch.cat(self._call_each(method, contiguous_shares(collate(batch), self.world_size)), dim=0)

    def compute_logprobs(self, batch: Mapping[str, Any]) -> torch.Tensor:
        return self._inference("compute_logprobs", batch)

    def compute_ref_logprobs(self, batch: Mapping[str, Any]) -> torch.Tensor:
        return self._inference("compute_ref_logprobs", batch)

    def compute_values(self, batch: Mapping[str, Any]) -> torch.Tensor:
        return self._inference("compute_values", batch)

    def compute_rewards(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The reward model's scores ``[B]`` (``LearnerWorker.compute_rewards``)."""
        rows = scored_rows(batch["input_ids"]) if "input_ids" in batch else batch
        return torch.cat(self._call_each("compute_rewards", contiguous_shares(collate(rows), self.world_size)))

    def _update(self, method: str, canonical: dict[str, torch.Tensor], *args: Any) -> dict[str, float]:
        shares = mini_batch_shares(canonical, self.world_size, self.config.mini_batch_size)
        return self._call_each(method, shares, *args)[0]  # the metrics are global: rank 0's

    def update_policy(self, batch: Mapping[str, Any]) -> dict[str, float]:
        return self._update("update_policy", collate(batch))

    def update_critic(self, batch: Mapping[str, Any]) -> dict[str, float]:
        return self._update("update_critic", collate(batch))

    def update_reward_model(self, batch: Mapping[str, Any], lr: float | None = None) -> dict[str, float]:
        """Bradley-Terry update on pairs; a pair's two sequences stay on one rank."""
        return self._update("update_reward_model", reward_model_batch(batch), lr)

    def update_sft(self, batch: Mapping[str, Any], lr: float | None = None) -> dict[str, float]:
        return self._call_each("update_sft", contiguous_shares(collate(batch), self.world_size), lr)[0]

    def rebase_reference(self) -> None:
        self._call_all("rebase_reference")

    def state_dict_for_rollout(self, dtype: str | None = None) -> dict[str, torch.Tensor]:
        return self._call_all("state_dict_for_rollout", dtype)[0]

    def push_weights(self, rollouts: list, version: int) -> None:
        """The policy into every rollout engine (``RolloutWorker`` actors): a broadcast over a weight-update group
        joined on the first call for these engines; the driver passes only the plan (names and shapes)."""
        import ray

        if getattr(self, "_weight_sync_for", None) != rollouts:
            self._join_weight_group(rollouts)
        plan = ray.get(self.workers[0].weight_plan.remote(self._rollout_dtype,
                                                          self.config.weight_sync_bucket_mb << 20))
        ray.get([w.send_weights.remote(plan) for w in self.workers]
                + [r.receive_weights.remote(plan, version) for r in rollouts])

    def _join_weight_group(self, rollouts: list) -> None:
        import ray

        receivers = ray.get([r.weight_receivers.remote() for r in rollouts])
        dtypes = {dtype for _, dtype in receivers}
        if len(dtypes) != 1:
            raise ValueError(f"weight sync: the rollout engines run different dtypes {sorted(dtypes)}; one "
                             f"broadcast serves one dtype")
        self._rollout_dtype = dtypes.pop()
        world_size = 1 + sum(n for n, _ in receivers)
        host, port, _ = ray.get(self.workers[0].node_endpoint.remote())
        first, calls = 1, [self.workers[0].join_weight_group.remote(host, port, world_size, self._backend())]
        for rollout, (n, _) in zip(rollouts, receivers):
            calls.append(rollout.join_weight_group.remote(host, port, first, world_size, self._backend()))
            first += n
        ray.get(calls)   # the group forms once every member has joined
        self._weight_sync_for = list(rollouts)

    def _backend(self) -> str:
        if self.config.weight_sync_backend != "auto":
            return self.config.weight_sync_backend
        return "nccl" if self.info[0]["device"].startswith("cuda") else "gloo"

    def save_checkpoint(self, path: str | os.PathLike, step: int, data_position: Any = None) -> str:
        return self._call_all("save_checkpoint", str(path), step, data_position)[0]

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        return self._call_all("load_checkpoint", str(path))[0]

    def export_model(self, path: str | os.PathLike) -> str:
        return self._call_all("export_model", str(path))[0]

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
