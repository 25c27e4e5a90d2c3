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

from pr_rlhf.actors import learner_group
from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.rl.batches import collate, contiguous_shares, mini_batch_shares, reward_model_batch, scored_rows
from workers.learner.worker import LearnerWorker
from workers.ray_utils import release_bundles, reserve_bundles

if TYPE_CHECKING:  # pragma: no cover
    from typing import Self


class LearnerGroup:
    """``world_size`` ``LearnerWorker`` actors in one placement group, driven together."""

    def __init__(self, config: LearnerConfig | Mapping[str, Any], *, name: str | None = None,
                 ready_timeout_s: float = 300.0, runtime_env: dict[str, Any] | None = None,
                 worker_cls: type[LearnerWorker] = LearnerWorker, colocated: Mapping[str, float] | None = None
                 ) -> None:
        """``worker_cls``: the rank's class (a subclass of ``LearnerWorker``; tests inject faults through one).
        ``colocated``: the Ray bundle of an actor that each rank's bundle also hosts (the colocated rollout engine,
        scheduled by the caller into ``placement_group`` bundle r)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.config = config if isinstance(config, LearnerConfig) else LearnerConfig.model_validate(config)
        cfg = self.config
        self.world_size = cfg.world_size
        group = learner_group(cfg, ray.cluster_resources().get("GPU", 0.0), colocated=colocated)   # as declared
        self._pg = reserve_bundles(list(group.bundles), group.placement_group, "learner", ready_timeout_s)
        remote_cls = ray.remote(worker_cls)
        # the custom resources stay in the placement group's bundle: the ranks run inside it
        own = group.options()
        options: dict[str, Any] = {"num_cpus": own["num_cpus"], "num_gpus": own["num_gpus"]}
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

    @property
    def placement_group(self) -> Any:
        """The ranks' placement group (bundle r: rank r, and the actor colocated with it)."""
        return self._pg

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
        """The policy into every rollout engine (``RolloutWorker`` actors) through vLLM's weight-transfer API; the
        transfer group forms on the first call for these engines. The driver only starts the calls: the weights go
        learner rank 0 -> engines (``workers.learner.weight_transfer``). A failed sync raises
        ``WeightTransferError`` (the engines keep their previous weights) and closes the group; the next call
        forms a new one."""
        import ray

        if getattr(self, "_transfer_for", None) != rollouts:
            self._open_transfer(rollouts)
        try:
            ray.get([w.send_weights.remote(version) for w in self.workers],
                    timeout=self._sync_deadline_s())
        except Exception:
            self.close_weight_transfer()
            raise

    def _sync_deadline_s(self) -> float:
        # each step of a sync waits at most weight_sync_timeout_s (join, a bucket, the engines' update, the
        # agreement): the whole sync a few of them
        return 4 * self.config.weight_sync_timeout_s

    def _open_transfer(self, rollouts: list) -> None:
        import ray

        self.close_weight_transfer()
        receivers = ray.get([r.weight_receivers.remote() for r in rollouts], timeout=self._sync_deadline_s())
        for what, values in (("dtypes", {dtype for _, dtype, _ in receivers}),
                             ("transfer backends", {backend for _, _, backend in receivers})):
            if len(values) != 1:
                raise ValueError(f"weight sync: the rollout engines run different {what} {sorted(values)}; one "
                                 "transfer serves one")
        _, dtype, backend = receivers[0]
        host, port, _ = ray.get(self.workers[0].node_endpoint.remote())
        ray.get([w.open_weight_transfer.remote(list(rollouts), [n for n, _, _ in receivers], backend, dtype, host,
                                               port) for w in self.workers], timeout=self._sync_deadline_s())
        self._transfer_for = list(rollouts)

    def close_weight_transfer(self) -> None:
        """Release the transfer group on the learner ranks and in the engines (they keep serving)."""
        import ray

        if getattr(self, "_transfer_for", None) is None:
            return
        self._transfer_for = None
        with suppress(Exception):   # a rank or an engine may be gone already: nothing left to release there
            ray.get([w.close_weight_transfer.remote() for w in self.workers],
                    timeout=self.config.weight_sync_timeout_s)

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

        self.close_weight_transfer()
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
