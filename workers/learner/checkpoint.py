"""The learner's state on disk and in full: gathering a sharded model's (or optimizer's) full state on rank 0,
loading one back into any world size, the weights as safetensors, RNG states, and the checkpoint folder.

A checkpoint ``dir``: ``dir/policy/`` holds ``model.safetensors`` (full weights, every state-dict name) + the
model's config and tokenizer files, i.e. an HF model directory, and ``optimizer.pt`` (the full AdamW state keyed by
parameter name, tensors and numbers only: ``torch.load(..., weights_only=True)``); ``dir/critic/`` likewise
(weights + optimizer); a reward-model learner's ``dir/reward_model/`` like the policy's, with the
sequence-classification config; ``dir/reference/model.safetensors`` once the reference was rebased onto the policy;
``dir/rng/rank_<r>.pt`` (torch / numpy / python ``random`` / CUDA RNG states); ``dir/meta.json`` written last
(step, data_position, world size, counters, config): a folder without it is incomplete. Full (unsharded) state
dicts make a checkpoint loadable at any world size.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pr_rlhf.files import atomic_write_text
from workers.learner.ranks import Ranks
from workers.learner.strategy import Strategy

CHECKPOINT_FORMAT = "pr_rlhf-learner-v1"
META = "meta.json"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
HF_MODELS = ("policy", "reward_model")  # saved as HF model directories (config and tokenizer beside the weights)


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
    """The full (unsharded) state dict, on CPU, on rank 0; ``{}`` on the other ranks. Collective."""
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


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, ranks: Ranks) -> dict[str, Any] | None:
    """The full optimizer state on rank 0 (``{}`` on the others); ``None`` everywhere before the first step."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    has_state = ranks.reduce([1.0 if optimizer.state else 0.0], op="max")[0] > 0
    if not has_state:  # no step yet: an empty optimizer (get_optimizer_state_dict would initialize one)
        return None
    state = get_optimizer_state_dict(model, optimizer,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if ranks.rank == 0 else {}


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, ranks: Ranks) -> None:
    """Load ``folder/optimizer.pt`` (read by rank 0, broadcast to the others) into a sharded or plain optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    osd = torch.load(folder / OPTIMIZER, weights_only=True, map_location="cpu") \
        if ranks.rank == 0 or not ranks.distributed else {}
    set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=ranks.distributed, strict=True))


# --------------------------------------------------------------------------------------------- safetensors I/O
def write_weights(folder: Path, weights: Mapping[str, torch.Tensor], hf_files_from: str | None = None) -> None:
    """``folder/model.safetensors`` holding every name of ``weights``; ``hf_files_from``: an HF model directory
    whose config and tokenizer files are copied next to it (the folder is then HF-loadable)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    # safetensors refuses tensors that share memory: a plain module's or a lone FSDP2 rank's tied embeddings come
    # back as one tensor under two names. Each name gets its own copy, so that every reader (HF, this module,
    # safetensors.numpy) finds every name. (safetensors.torch.save_model would drop the alphabetically first
    # name, model.embed_tokens.weight, and it wants a module, while a sharded model's full state is a dict here.)
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in weights.items():
        tensor = tensor.detach().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if tensor.numel() and storage in storages else tensor
        storages.add(storage)
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    if hf_files_from is not None:
        for f in Path(hf_files_from).iterdir():
            if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".pt")) \
                    and not f.name.endswith(".safetensors.index.json"):
                shutil.copy2(f, folder / f.name)


def export_hf_folder(folder: Path, weights: Mapping[str, torch.Tensor], model_dir: str, model: nn.Module) -> None:
    """``weights`` as an HF-loadable folder: the model directory's config and tokenizer files, then the model's
    own config when it differs in kind (a reward model's sequence-classification config: its class, one label,
    the pad id it was trained with)."""
    write_weights(folder, weights, model_dir)
    config = getattr(model, "config", None)
    if config is not None and getattr(model, "score", None) is not None:
        config.save_pretrained(folder)


def read_weights(folder: Path, ranks: Ranks) -> dict[str, torch.Tensor]:
    """``folder/model.safetensors``, read by rank 0 only when distributed (the others get it by broadcast)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if ranks.rank != 0 and ranks.distributed:
        return {}
    path = folder / WEIGHTS
    state = load_file(str(path))
    # files written by a single rank before every name was stored list their tied names as aliases
    with safe_open(str(path), framework="pt") as f:
        for name, source in json.loads((f.metadata() or {}).get("aliases", "{}")).items():
            state[name] = state[source]
    return state


# ------------------------------------------------------------------------------------------ checkpoint folder
def read_checkpoint_meta(path: str | os.PathLike) -> dict[str, Any]:
    meta_path = Path(path) / META
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path}: no {META}: not a learner checkpoint, or an incomplete one")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: checkpoint format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
    return meta


def save_checkpoint(root: Path, *, trained: Sequence[tuple[str, nn.Module, torch.optim.Optimizer]],
                    reference: nn.Module | None, strategy: Strategy, ranks: Ranks, model_dir: str,
                    meta: Mapping[str, Any]) -> None:
    """Write the checkpoint folder (module docstring): the ``trained`` models (name, model, optimizer) with their
    optimizer states, the ``reference`` when given, this rank's RNG state, then ``meta.json`` (``meta`` plus the
    format, world size and what each model folder holds). Collective."""
    if ranks.rank == 0:
        if root.exists() and (root / META).exists():
            (root / META).unlink()  # overwriting: incomplete until the new meta lands
        root.mkdir(parents=True, exist_ok=True)
        (root / "rng").mkdir(exist_ok=True)
    ranks.barrier()
    torch.save(rng_state(), root / "rng" / f"rank_{ranks.rank}.pt")
    models: dict[str, Any] = {}
    for name, model, optimizer in trained:
        optim_state = full_optimizer_state(model, optimizer, ranks)
        weights = full_model_state(model, strategy, ranks)
        if ranks.rank == 0:
            if name in HF_MODELS:
                export_hf_folder(root / name, weights, model_dir, model)
            else:
                write_weights(root / name, weights)
            if optim_state:
                torch.save(optim_state, root / name / OPTIMIZER)
        models[name] = {"optimizer": optim_state is not None}
        del weights, optim_state
    if reference is not None:
        weights = full_model_state(reference, strategy, ranks)
        if ranks.rank == 0:
            write_weights(root / "reference", weights)
        models["reference"] = {"optimizer": False}
        del weights
    ranks.barrier()
    if ranks.rank == 0:
        full_meta = {"format": CHECKPOINT_FORMAT, **meta, "world_size": ranks.world_size, "models": models,
                     "saved_at": time.time()}
        atomic_write_text(root / META, json.dumps(full_meta, indent=1))
    ranks.barrier()


def restore_rng(root: Path, meta: Mapping[str, Any], ranks: Ranks, seed: int) -> bool:
    """This rank's saved RNG states when the world size matches (returns True); otherwise a reseed from ``seed``
    and the checkpoint's step (returns False)."""
    rng_file = root / "rng" / f"rank_{ranks.rank}.pt"
    if rng_file.is_file() and meta["world_size"] == ranks.world_size:
        set_rng_state(torch.load(rng_file, weights_only=True))
        return True
    seed_everything(seed + ranks.rank + int(meta["step"]))
    return False
