"""The learner's state on disk: sharded checkpoints (torch.distributed.checkpoint, every rank writes its own shard),
the trained model streamed out as an HF model folder, RNG states, and loading either back at any world size.

A checkpoint ``dir`` (format ``pr_rlhf-learner-v2``):

- ``dir/shards/``: one DCP checkpoint (``.metadata`` + ``__<rank>_0.distcp``, one file per rank holding only that
  rank's shards) of every model the learner holds: ``<name>.model.<param>`` for the trained models (``policy`` and
  ``critic``, or ``reward_model``) and, once it was rebased onto the policy, the ``reference``; and each trained
  model's AdamW state (``<name>.optimizer.state.<param>.exp_avg`` ...), keyed by parameter name, once the optimizer
  has stepped. DCP reshards on load, so a checkpoint loads at any world size and either strategy.
- ``dir/policy/`` (``dir/reward_model/`` for a reward-model learner): the trained model as an HF model directory
  (config, tokenizer and generation config beside the weights: ``model.safetensors``, or HF's sharded layout
  ``model-00001-of-0000N.safetensors`` + ``model.safetensors.index.json``), streamed out (``export_hf_folder``): no
  host holds more than one bucket of it. Nothing resumes from it; engines and people load it.
- ``dir/rng/rank_<r>.pt``: each rank's torch / numpy / python ``random`` / CUDA RNG states.
- ``dir/meta.json``, written last (step, data_position, world size, counters, config, what each model has): a
  folder without it is incomplete.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pr_rlhf.files import atomic_write_text
from workers.learner.ranks import Ranks
from workers.learner.strategy import Strategy

CHECKPOINT_FORMAT = "pr_rlhf-learner-v2"
META = "meta.json"
SHARDS = "shards"                      # the DCP checkpoint's folder
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
HF_MODELS = ("policy", "reward_model")  # exported as HF model directories in every checkpoint
MODEL_FOLDERS = ("policy", "critic", "reward_model", "reference")
# The most bytes of weights one HF export file holds, and so the most rank 0 holds while exporting (plus the one
# tensor being gathered; a tensor larger than this gets a file of its own).
EXPORT_SHARD_BYTES = 512 * 2**20
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".distcp", ".safetensors.index.json",
                        ".bin.index.json")   # never copied from a model directory into an export


# ----------------------------------------------------------------------------------------------------- RNG states
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
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


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), int(state["numpy_pos"]),
                         int(state["numpy_has_gauss"]), float(state["numpy_cached_gaussian"])))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------- full state dicts
def full_model_state(model: nn.Module, strategy: Strategy, ranks: Ranks) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict, on CPU, on rank 0; ``{}`` on the other ranks. Collective. (The whole model
    on one host: for small models and tests; checkpoints and exports never call it.)"""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    strategy.reshard(model)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if ranks.rank == 0 else {}


def load_full_model_state(model: nn.Module, weights: Mapping[str, torch.Tensor], strategy: Strategy,
                          ranks: Ranks) -> None:
    """Load a full state dict (present on rank 0 only when distributed) into a sharded or plain model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    strategy.reshard(model)
    set_model_state_dict(model, dict(weights), options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=ranks.distributed, strict=True))
    strategy.reshard(model)


# ------------------------------------------------------------------------------------- sharded state (DCP)
def _has_optimizer_state(optimizer: torch.optim.Optimizer, ranks: Ranks) -> bool:
    """Whether the optimizer has stepped (on any rank). Before that it is saved as absent: asking DCP's state-dict
    API for an empty optimizer's state initializes it with a zero-learning-rate step, whose step count would change
    the bias correction of the first real step."""
    return ranks.reduce([1.0 if optimizer.state else 0.0], op="max")[0] > 0


def sharded_state(models: Mapping[str, tuple[nn.Module, torch.optim.Optimizer | None]],
                  strategy: Strategy) -> dict[str, dict[str, Any]]:
    """``{name: {"model": state, "optimizer": state}}``: this rank's shards (DTensors under FSDP2, the tensors
    themselves for a plain module) keyed by parameter name; no ``optimizer`` where it is None. The tensors are the
    model's and the optimizer's own: ``dcp.load`` into them loads in place."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    out: dict[str, dict[str, Any]] = {}
    for name, (model, optimizer) in models.items():
        strategy.reshard(model)
        out[name] = {"model": get_model_state_dict(model)}
        if optimizer is not None:
            out[name]["optimizer"] = get_optimizer_state_dict(model, optimizer)
    return out


def save_sharded(folder: Path, models: Mapping[str, tuple[nn.Module, torch.optim.Optimizer | None]],
                 strategy: Strategy) -> None:
    """``folder``: a DCP checkpoint of ``models`` (``sharded_state``); every rank writes its own file. Collective."""
    import torch.distributed.checkpoint as dcp

    dcp.save(sharded_state(models, strategy), storage_writer=dcp.FileSystemWriter(str(folder)))


def load_sharded(folder: Path, models: Mapping[str, tuple[nn.Module, torch.optim.Optimizer | None]],
                 strategy: Strategy) -> None:
    """Load ``models`` (and the optimizers given) from the DCP checkpoint ``folder``, saved at any world size.
    Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    # an optimizer without state yet gets one here (a zero-learning-rate step that leaves the weights as they are):
    # DCP loads into existing tensors, and every one of them is overwritten from the checkpoint
    state = sharded_state(models, strategy)
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(folder)))
    for name, (model, optimizer) in models.items():
        set_model_state_dict(model, state[name]["model"])
        if optimizer is not None:
            set_optimizer_state_dict(model, optimizer, state[name]["optimizer"])
        strategy.reshard(model)


# ------------------------------------------------------------------------------------- HF export (streamed)
def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    return DTensor


def plan_export_files(shapes: Iterable[tuple[str, Sequence[int], torch.dtype]],
                      max_bytes: int) -> list[list[str]]:
    """The names (in order) of each export file: consecutive tensors up to ``max_bytes`` per file (a larger one
    alone). The same on every rank: it needs only names, global shapes and dtypes."""
    files: list[list[str]] = []
    size = 0
    for name, shape, dtype in shapes:
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        if not files or (files[-1] and size + nbytes > max_bytes):
            files.append([])
            size = 0
        files[-1].append(name)
        size += nbytes
    return files


def export_file_names(count: int) -> list[str]:
    """HF's names: ``model.safetensors`` alone, or ``model-0000i-of-0000N.safetensors``."""
    if count <= 1:
        return [WEIGHTS]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def _distinct(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (a plain module's tied embeddings are one tensor under two
    names): each name gets its own copy, so that every reader (HF, safetensors.numpy) finds every name."""
    out: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in tensors.items():
        tensor = tensor.detach().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if tensor.numel() and storage in storages else tensor
        storages.add(storage)
    return out


def clear_weights(folder: Path) -> None:
    """Remove weight files (and a sharded index) a previous export left in ``folder``."""
    if folder.is_dir():
        for f in folder.iterdir():
            if f.is_file() and f.name.endswith(WEIGHT_FILE_SUFFIXES):
                f.unlink()


def write_model_files(folder: Path, model_dir: str, model: nn.Module) -> None:
    """The HF files beside the weights: ``model_dir``'s config, tokenizer and generation config (copied from a
    local directory, else saved from the hub's), then the model's own config (its dtype, and for a reward model its
    sequence-classification class, one label and the pad id it was trained with)."""
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(model_dir)
    if source.is_dir():
        for f in source.iterdir():
            if f.is_file() and not f.name.endswith(WEIGHT_FILE_SUFFIXES):
                shutil.copy2(f, folder / f.name)
    else:  # a hub name (PR_RLHF_ALLOW_HUB): its tokenizer through transformers
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(model_dir).save_pretrained(folder)
    config = getattr(model, "config", None)
    if config is None:
        return
    if not getattr(config, "architectures", None):
        config.architectures = [type(model).__name__.removeprefix("FSDP")]
    config.save_pretrained(folder)
    generation = getattr(model, "generation_config", None)
    if generation is not None and not (folder / "generation_config.json").is_file():
        generation.save_pretrained(folder)


def export_hf_folder(folder: Path, model: nn.Module, model_dir: str, strategy: Strategy, ranks: Ranks,
                     max_shard_bytes: int | None = None) -> list[str]:
    """``model`` as an HF-loadable folder (every state-dict name, in the model's dtype), streamed: the files (of
    at most ``max_shard_bytes``, default ``EXPORT_SHARD_BYTES``) are planned from the shapes, then for each file
    every rank gathers its tensors one at a time (``DTensor.full_tensor()``) and rank 0 writes the file, so no host
    holds more than one file of weights. ``write_model_files`` adds the config and tokenizer. Collective; returns
    the weight files' names."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dtensor = _dtensor_type()
    strategy.reshard(model)
    state = get_model_state_dict(model)  # this rank's shards, under HF names
    files = plan_export_files(((name, t.shape, t.dtype) for name, t in state.items()),
                              max_shard_bytes or EXPORT_SHARD_BYTES)
    names = export_file_names(len(files))
    if ranks.rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        clear_weights(folder)
    weight_map: dict[str, str] = {}
    total = 0
    with torch.no_grad():
        for file_name, tensor_names in zip(names, files):
            bucket: dict[str, torch.Tensor] = {}
            for name in tensor_names:
                tensor = state[name]
                full = tensor.full_tensor() if dtensor is not None and isinstance(tensor, dtensor) else tensor
                if ranks.rank == 0:
                    bucket[name] = full.detach().cpu()
                    weight_map[name] = file_name
                    total += full.numel() * full.element_size()
                del full
            if ranks.rank == 0:
                save_file(_distinct(bucket), str(folder / file_name), metadata={"format": "pt"})
            del bucket
    if ranks.rank == 0:
        if len(names) > 1:
            atomic_write_text(folder / WEIGHTS_INDEX, json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        write_model_files(folder, model_dir, model)
    strategy.reshard(model)
    ranks.barrier()
    return names


def read_export(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an exported folder (single file or sharded) on this host: for tests and small models."""
    from safetensors.torch import load_file

    index = folder / WEIGHTS_INDEX
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [WEIGHTS]
    return {k: v for f in files for k, v in load_file(str(folder / f)).items()}


# ------------------------------------------------------------------------------------------ checkpoint folder
def read_checkpoint_meta(path: str | os.PathLike) -> dict[str, Any]:
    meta_path = Path(path) / META
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path}: no {META}: not a learner checkpoint, or an incomplete one")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: checkpoint format {meta.get('format')!r}; this learner reads "
                         f"{CHECKPOINT_FORMAT!r} only")
    return meta


def _clear_checkpoint(root: Path) -> None:
    """Rank 0, before saving over an old checkpoint: it is incomplete from here on (no meta), and none of its
    files (another world size's shards, another count of export files) survives into the new one."""
    if (root / META).exists():
        (root / META).unlink()
    for name in (SHARDS, "rng", *MODEL_FOLDERS):
        if (root / name).is_dir():
            shutil.rmtree(root / name)


def save_checkpoint(root: Path, *, trained: Sequence[tuple[str, nn.Module, torch.optim.Optimizer]],
                    reference: nn.Module | None, strategy: Strategy, ranks: Ranks, model_dir: str,
                    meta: Mapping[str, Any]) -> None:
    """Write the checkpoint folder (module docstring): this rank's RNG state, the sharded state of the ``trained``
    models (name, model, optimizer) and of the ``reference`` when given, the HF export of the policy (or reward
    model), then ``meta.json`` (``meta`` plus the format, world size and what each model has). Collective."""
    if ranks.rank == 0:
        _clear_checkpoint(root)
        (root / "rng").mkdir(parents=True, exist_ok=True)
    ranks.barrier()
    torch.save(rng_state(), root / "rng" / f"rank_{ranks.rank}.pt")
    models: dict[str, tuple[nn.Module, torch.optim.Optimizer | None]] = {}
    described: dict[str, Any] = {}
    for name, model, optimizer in trained:
        stepped = _has_optimizer_state(optimizer, ranks)
        models[name] = (model, optimizer if stepped else None)
        described[name] = {"optimizer": stepped, "hf_export": name in HF_MODELS}
    if reference is not None:
        models["reference"] = (reference, None)
        described["reference"] = {"optimizer": False, "hf_export": False}
    save_sharded(root / SHARDS, models, strategy)
    for name, model, _ in trained:
        if name in HF_MODELS:
            export_hf_folder(root / name, model, model_dir, strategy, ranks)
    ranks.barrier()
    if ranks.rank == 0:
        full_meta = {"format": CHECKPOINT_FORMAT, **meta, "world_size": ranks.world_size, "models": described,
                     "shards": SHARDS, "saved_at": time.time()}
        atomic_write_text(root / META, json.dumps(full_meta, indent=1))
    ranks.barrier()


def load_checkpoint(root: Path, meta: Mapping[str, Any],
                    models: Mapping[str, tuple[nn.Module, torch.optim.Optimizer | None]], strategy: Strategy,
                    ranks: Ranks) -> None:
    """Load ``models`` (name -> model and the optimizer to restore, None for none) from the checkpoint ``root``
    whose ``meta`` this is (the DCP shards reshard to any world size). Collective."""
    load_sharded(root / meta.get("shards", SHARDS), models, strategy)


def restore_rng(root: Path, meta: Mapping[str, Any], ranks: Ranks, seed: int) -> bool:
    """This rank's saved RNG states when the world size matches (returns True); otherwise a reseed from ``seed``
    and the checkpoint's step (returns False)."""
    rng_file = root / "rng" / f"rank_{ranks.rank}.pt"
    if rng_file.is_file() and meta["world_size"] == ranks.world_size:
        set_rng_state(torch.load(rng_file, weights_only=True))
        return True
    seed_everything(seed + ranks.rank + int(meta["step"]))
    return False
