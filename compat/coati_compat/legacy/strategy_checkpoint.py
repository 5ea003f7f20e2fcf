"""Checkpoints of the legacy strategies: ``save_model`` / ``save_optimizer`` in the call forms of both legacy
releases, and loads that read each form back.

Reference version (ColossalAI ``b5f056636``), the meaning kept by default:

- ``save_model(model, path, only_rank0=True)``: rank 0 writes the whole state dict to one file; with
  ``only_rank0=False`` every rank writes it to its own ``path``.
- ``save_optimizer(optimizer, path, only_rank0=False)``: every rank writes the optimizer state to its own ``path``
  (a path per rank, e.g. ``optim-r{rank}.pt``, or one path for all); ``load_optimizer`` reads it back on each rank.
  Here each rank writes the *complete* state (ZeRO/Gemini gather it), so a path shared by all ranks holds a file any
  rank can load; ``only_rank0=True`` writes it once, from rank 0.

Final release (``be400a093``): ``save_model(model, path, shard=True, **booster_kwargs)`` writes the booster's sharded
checkpoint directory. The third positional argument of ``save_model`` is ``only_rank0`` unless
``COATI_RELAY_LEGACY_NAMES=final``, which reads it as ``shard`` and makes ``save_optimizer`` write the booster's
sharded directory as the final release did (``only_rank0=False`` meant ``shard=True``).

Per-rank files are written to a temporary name and renamed into place, so ranks sharing one path never leave a
torn file. Loads take a file or a sharded directory; ``map_location`` (reference form) or ``strict`` (final form)
may come third.
"""
from __future__ import annotations

import inspect
import os
import tempfile
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from coati_compat import legacy_switch


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def model_save_form(extra: Sequence[Any], only_rank0: Optional[bool], shard: Optional[bool]) -> Tuple[bool, bool]:
    """``(only_rank0, shard)`` of a ``save_model`` call; ``extra``: the positional arguments after ``path``."""
    if len(extra) > 1:
        raise TypeError(f"save_model(model, path[, only_rank0]) takes one more positional argument, got {len(extra)}; "
                        "pass the others by keyword (shard=..., only_rank0=...)")
    if extra:
        name = "shard" if legacy_switch.final_release() else "only_rank0"
        if (shard if name == "shard" else only_rank0) is not None:
            raise TypeError(f"save_model got {name} both as third positional argument and by keyword")
        if name == "shard":
            shard = extra[0]
        else:
            only_rank0 = extra[0]
    if shard and only_rank0 is False:
        raise ValueError("save_model: shard=True writes one sharded directory (the booster's, from the ranks that "
                         "hold the weights); only_rank0=False asks for a file per rank. Pass one of them.")
    return (True if only_rank0 is None else bool(only_rank0)), bool(shard)


def load_form(extra: Sequence[Any], strict: Optional[bool], map_location: Any) -> Tuple[bool, Any]:
    """``(strict, map_location)`` of a ``load_model`` call: the reference form put ``map_location`` third and
    ``strict`` fourth, the final release ``strict`` third."""
    extra = list(extra)
    if extra and isinstance(extra[0], bool):  # final release: load_model(model, path, strict)
        if strict is not None or len(extra) > 1:
            raise TypeError("load_model(model, path, strict): strict given twice or extra positional arguments")
        return extra[0], map_location
    if len(extra) > 2:
        raise TypeError(f"load_model(model, path[, map_location[, strict]]) got {len(extra)} extra arguments")
    if extra:
        if map_location is not None:
            raise TypeError("load_model got map_location both positionally and by keyword")
        map_location = extra[0]
    if len(extra) == 2:
        if strict is not None:
            raise TypeError("load_model got strict both positionally and by keyword")
        strict = extra[1]
    return (True if strict is None else bool(strict)), map_location


def complete_state_dict(obj: Any) -> Dict[str, Any]:
    """The complete state dict of a model or optimizer on this rank: Gemini gathers it on every rank
    (``only_rank_0=False``), ZeRO optimizers gather their shards in ``state_dict()``."""
    if hasattr(obj, "_force_wait_all_gather"):  # LowLevelZero with overlapped all-gather
        obj._force_wait_all_gather()
    if "only_rank_0" in inspect.signature(obj.state_dict).parameters:
        return obj.state_dict(only_rank_0=False)
    return obj.state_dict()


def save_file(state: Dict[str, Any], path: str) -> None:
    """``torch.save(state, path)`` through a temporary file in the same directory and a rename."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory (a sharded checkpoint?); save to a file path, or pass "
                                "shard=True / COATI_RELAY_LEGACY_NAMES=final for a sharded directory")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot save {path}: the directory {directory} does not exist")
    handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.r{rank()}.", dir=directory)
    os.close(handle)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def checkpoint_io(booster: Any) -> Any:
    """The booster, or ColossalAI's plain ``GeneralCheckpointIO`` for strategies without one."""
    if booster is not None:
        return booster
    from colossalai.checkpoint_io import GeneralCheckpointIO

    return GeneralCheckpointIO()


def check_exists(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {what} checkpoint at {path}; with only_rank0=True only rank 0 wrote one (load it "
                                "on every rank from a path they share, or save with only_rank0=False)")


def save_model(booster: Any, model: nn.Module, state_of: nn.Module, path: str, only_rank0: bool, shard: bool,
               **kwargs: Any) -> None:
    """``state_of``: the module whose state a file holds (without a booster: the model as given)."""
    if shard or (only_rank0 and booster is not None):
        checkpoint_io(booster).save_model(model, path, shard=shard, **kwargs)  # every rank calls: Gemini gathers
        return
    if kwargs:
        raise TypeError(f"save_model: {sorted(kwargs)} apply to the booster's checkpoints (shard=True, or "
                        "only_rank0=True under a booster strategy); a per-rank file takes none")
    if only_rank0 and rank() != 0:
        return
    save_file(complete_state_dict(state_of), path)


def load_model(booster: Any, model: nn.Module, path: str, strict: bool, map_location: Any) -> None:
    check_exists(path, "model")
    if booster is not None or os.path.isdir(path):
        checkpoint_io(booster).load_model(model, path, strict=strict)
        return
    model.load_state_dict(torch.load(path, map_location=map_location or "cpu"), strict=strict)


def save_optimizer(booster: Any, optimizer: Any, path: str, only_rank0: bool, **kwargs: Any) -> None:
    if legacy_switch.final_release():
        checkpoint_io(booster).save_optimizer(optimizer, path, shard=not only_rank0, **kwargs)
        return
    if kwargs:
        raise TypeError(f"save_optimizer: {sorted(kwargs)} apply to the booster's sharded checkpoint "
                        "(COATI_RELAY_LEGACY_NAMES=final); the legacy per-rank file takes none")
    if only_rank0 and booster is not None:
        booster.save_optimizer(optimizer, path, shard=False)  # every rank calls (ZeRO/Gemini gather), rank 0 writes
        return
    state = complete_state_dict(optimizer)
    if not only_rank0 or rank() == 0:
        save_file(state, path)


def read_sharded_optimizer(path: str) -> Dict[str, Any]:
    """The ``{"state", "param_groups"}`` dict of a sharded optimizer directory (ColossalAI's layout: an index file,
    a param-group file and state shards), for optimizers whose state every rank holds whole."""
    from colossalai.checkpoint_io.index_file import CheckpointIndexFile
    from colossalai.checkpoint_io.utils import has_index_file

    found, index_path = has_index_file(path)
    if not found:
        raise FileNotFoundError(f"{path} holds no sharded checkpoint index (*.index.json)")
    index = CheckpointIndexFile.from_file(index_path)
    groups_path = index.get_param_group_filename()
    if groups_path is None:
        raise ValueError(f"{index_path} is not an optimizer checkpoint (no param_groups file)")
    state: Dict[int, Any] = {}
    shards, _ = index.get_checkpoint_filenames()
    for shard in shards:
        state.update({int(k): v for k, v in torch.load(shard, map_location="cpu").items()})
    return {"state": state, "param_groups": torch.load(groups_path, map_location="cpu")}


def load_optimizer(booster: Any, optimizer: Any, path: str, map_location: Any, replicated: bool) -> None:
    """replicated: every rank holds the whole optimizer state (no booster, or torch DDP); sharded directories are
    then read here (ColossalAI's own reader needs a CUDA accelerator)."""
    check_exists(path, "optimizer")
    if os.path.isdir(path) and replicated:
        optimizer.load_state_dict(read_sharded_optimizer(path))
    elif booster is not None:
        booster.load_optimizer(optimizer, path)
    else:
        optimizer.load_state_dict(torch.load(path, map_location=map_location or "cpu"))
