"""One place to start or join Ray safely.

- :func:`init_local_ray` starts a private single-node cluster: every listener on 127.0.0.1
  (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), its temp dir (sockets, logs, spilled objects) in a private folder
  under the repository's ``.ray_tmp/`` (or a given one) instead of ``/tmp/ray``, no dashboard unless asked, no
  usage-stats reporting. ``address="local"`` is passed so that it never attaches to some other cluster found
  through ``RAY_ADDRESS`` or a stale ``ray_current_cluster`` file. Calling it again while Ray is up is a no-op.
- :func:`init_ray` joins an existing cluster when given an address (or ``RAY_ADDRESS`` is set: the case of
  ``ray job submit``), else starts a local one as above.
- :func:`shutdown_local_ray` stops what :func:`init_local_ray` started and removes its private temp dir.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEMP_ROOT = REPO_ROOT / ".ray_tmp"
# Unix socket paths are limited to 107 bytes; Ray appends up to ~63 characters
# ("/session_2026-01-01_00-00-00_000000_1234567/sockets/plasma_store") to its temp dir.
MAX_TEMP_DIR_CHARS = 44
DEFAULT_OBJECT_STORE_BYTES = 2 << 30  # plenty for tiny/small models (more spills to disk); Ray's default: 30% of RAM


@dataclass
class LocalRay:
    """What :func:`init_local_ray` set up (``started`` is False when Ray was already running)."""

    temp_dir: str | None
    started: bool
    owns_temp_dir: bool = False


_STATE: LocalRay | None = None


def current_node_id() -> str:
    """The Ray node this process runs on ("local" outside Ray): actors report it so placement can be checked."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    except Exception:  # noqa: BLE001 - outside an actor or a driver
        return "local"


def node_resources() -> dict[str, dict[str, float]]:
    """node id -> that node's custom resources (CPU, GPU, memory and Ray's own node:... markers left out)."""
    import ray

    builtin = ("CPU", "GPU", "memory", "object_store_memory", "accelerator_type")
    return {n["NodeID"]: {k: v for k, v in n.get("Resources", {}).items()
                          if not k.startswith(builtin) and not k.startswith("node:")}
            for n in ray.nodes() if n.get("Alive")}


def reserve_bundles(bundles: list[dict[str, float]], strategy: str, what: str, timeout_s: float = 300.0) -> Any:
    """A ready placement group for ``bundles``, or a clear error naming ``what`` and the cluster's free resources
    (an actor asking for resources no node offers would otherwise wait forever)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group(bundles, strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except Exception as exc:
        remove_placement_group(pg)
        raise RuntimeError(f"{what}: placement group ({len(bundles)} x {bundles[0]}, {strategy}) not ready after "
                           f"{timeout_s:.0f} s; free resources: {ray.available_resources()}") from exc
    return pg


def release_bundles(pg: Any) -> None:
    from contextlib import suppress

    from ray.util.placement_group import remove_placement_group

    if pg is not None:
        with suppress(Exception):  # already gone
            remove_placement_group(pg)


def loopback_env() -> None:
    """Environment that keeps Ray on loopback and quiet; effective for processes Ray starts from here on."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _loopback_constants() -> None:
    """``ray_constants`` reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, at import: if Ray was imported before
    the variable was set, set the constant itself (``services.get_node_ip_address`` reads it per call)."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def _private_temp_dir(temp_dir: str | os.PathLike | None) -> tuple[str, bool]:
    if temp_dir is not None:
        path = Path(temp_dir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return str(path), False
    root = private_temp_root()
    Path(root).mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix="ray-", dir=root), True


def private_temp_root() -> str:
    """Where :func:`init_local_ray` makes its private temp dirs: the repository's ``.ray_tmp``, or ``$TMPDIR`` for a
    checkout too deep for Ray's socket paths."""
    root = str(DEFAULT_TEMP_ROOT)
    if len(root) + len("/ray-xxxxxxxx") > MAX_TEMP_DIR_CHARS:
        return os.environ.get("TMPDIR") or "/tmp"
    return root


def init_local_ray(num_cpus: float | None = None, temp_dir: str | os.PathLike | None = None, *,
                   include_dashboard: bool = False, object_store_memory: int | None = DEFAULT_OBJECT_STORE_BYTES,
                   num_gpus: float | None = None, worker_env: dict[str, str] | None = None,
                   **init_kwargs: Any) -> LocalRay:
    """Start a private local Ray (loopback only), or return at once when Ray is already initialized.

    ``temp_dir``: Ray's temp dir; default a fresh ``.ray_tmp/ray-XXXX`` under the repository (removed by
    :func:`shutdown_local_ray`). ``num_cpus`` are logical: more than the cores lets several small actors share
    them. Ray's processes also get ``TMPDIR`` pointing inside the temp dir (vLLM and torch write there) and, unless
    set, ``TORCHINDUCTOR_CACHE_DIR`` in a ``torchinductor`` folder that outlives the session (beside the default
    temp dir, inside a given one); this process keeps its own environment. ``worker_env``: more variables for
    every Ray process (Serve's proxies read theirs at start).
    """
    global _STATE
    loopback_env()
    import ray

    _loopback_constants()
    if ray.is_initialized():
        return _STATE if _STATE is not None else LocalRay(temp_dir=None, started=False)
    path, owned = _private_temp_dir(temp_dir)
    scratch = Path(path) / "tmp"
    scratch.mkdir(exist_ok=True)
    kwargs: dict[str, Any] = {"address": "local", "num_cpus": num_cpus, "num_gpus": num_gpus, "_temp_dir": path,
                              "include_dashboard": include_dashboard, "object_store_memory": object_store_memory,
                              "logging_level": "WARNING"}
    if include_dashboard:
        kwargs["dashboard_host"] = "127.0.0.1"
    kwargs.update(init_kwargs)
    # Inherited by the raylet, hence by every worker process; this process keeps its own values.
    ray_env = {"TMPDIR": str(scratch), **(worker_env or {})}
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        # torch.compile caches (vLLM compiles its logprob kernel: ~15 s cold, a few s warm) outlive the session.
        ray_env["TORCHINDUCTOR_CACHE_DIR"] = str((Path(path).parent if owned else Path(path)) / "torchinductor")
    saved = {k: os.environ.get(k) for k in ray_env}
    os.environ.update(ray_env)
    try:
        ray.init(**kwargs)
    except BaseException:
        if owned:
            shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    _STATE = LocalRay(temp_dir=path, started=True, owns_temp_dir=owned)
    return _STATE


def init_ray(address: str | None = None, *, worker_env: dict[str, str] | None = None,
             **local_kwargs: Any) -> LocalRay:
    """Join the cluster at ``address`` (or ``$RAY_ADDRESS``, e.g. under ``ray job submit``); with neither, start
    a private local one with :func:`init_local_ray`. ``worker_env``: variables for the processes this job starts
    (on a joined cluster through the job's runtime env, which actors they create inherit)."""
    global _STATE
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None or address == "local":
        return init_local_ray(worker_env=worker_env, **local_kwargs)
    import ray

    if not ray.is_initialized():
        ray.init(address=address, logging_level="WARNING",
                 **({"runtime_env": {"env_vars": dict(worker_env)}} if worker_env else {}))
        _STATE = LocalRay(temp_dir=None, started=False)
    return _STATE or LocalRay(temp_dir=None, started=False)


def start_driver(address: str | None, min_cpus: float, *, shards: str | None = None, world: Any = None,
                 log: Any = print) -> LocalRay:
    """What every driver does first: the recipe's synthetic ``world`` built into ``shards`` when absent (no world:
    the shards are the user's), then Ray joined at ``address``, or a private local Ray offering at least
    ``min_cpus`` logical CPUs (enough for every actor of the run, even on a 2-core laptop)."""
    if world is not None:
        from data_pipelines.build import ensure_world_shards

        ensure_world_shards(shards, world, log=log)
    return init_ray(address, num_cpus=max(os.cpu_count() or 1, math.ceil(min_cpus)))


def check_resources(recipe: Any, command: str, wait_s: float = 120.0, log: Any = print) -> list:
    """``pr_rlhf.resources.check`` of ``command``'s actors against the cluster this driver joined, before any actor
    starts: a recipe that cannot run raises here, naming its field, instead of leaving actors pending. A cluster too
    small may still be growing (a KubeRay job starts once the head is up, worker pods join after): a shortfall is
    retried for ``wait_s`` seconds on a joined cluster, never on the local one this process started."""
    from pr_rlhf.resources import check

    return _until_it_fits(lambda nodes: check(recipe, command, nodes), wait_s, log)


def check_declared(groups: list, wait_s: float = 120.0, log: Any = print) -> list:
    """:func:`check_resources` for actor groups declared from a section alone (the reward service's replicas)."""
    from pr_rlhf.resources import check_groups

    return _until_it_fits(lambda nodes: check_groups(groups, nodes), wait_s, log)


def _until_it_fits(check: Any, wait_s: float, log: Any) -> list:
    import time

    import ray

    from pr_rlhf.resources import ClusterFitError

    deadline = time.monotonic() + (0.0 if _STATE is not None and _STATE.started else wait_s)
    while True:
        nodes = [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]
        try:
            return check(nodes)
        except ClusterFitError as exc:
            if time.monotonic() >= deadline:
                raise
            log(f"{exc}; waiting for nodes to join")
            time.sleep(5.0)


def shutdown_local_ray(remove_temp_dir: bool = True) -> None:
    """Stop the Ray that :func:`init_local_ray` started here (only that one: never ``ray stop``), then remove its
    private temp dir (or, for a caller-given dir, only the ``ray_current_cluster`` marker)."""
    global _STATE
    import ray

    state, _STATE = _STATE, None
    if ray.is_initialized():
        ray.shutdown()
    if state is None or not state.started or state.temp_dir is None:
        return
    if state.owns_temp_dir and remove_temp_dir:
        shutil.rmtree(state.temp_dir, ignore_errors=True)
    else:
        Path(state.temp_dir, "ray_current_cluster").unlink(missing_ok=True)
