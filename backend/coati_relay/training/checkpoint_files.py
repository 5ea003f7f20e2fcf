"""Model and optimizer files of one `TrainingBackend`: the booster's checkpoint IO, or plain torch files written
atomically.

Forms (every rank of the data-parallel group calls each function; ZeRO and Gemini gather inside):

- ``shard=True``: the checkpoint IO's sharded directory (ColossalAI's layout: an index file and shards).
- one file from rank 0: under a booster its checkpoint IO writes it (``torch.save`` of the complete state dict);
  without one, rank 0 writes ``torch.save(state_dict)``.
- every write goes to a temporary name in the target's directory, is fsynced and then renamed into place
  (`save_file`, `booster_save`): a process killed mid-write leaves the previous checkpoint whole.
- ``every_rank=True``: every rank writes the complete state dict to its own ``path`` (a path per rank, or one
  shared path: each write goes to a temporary name in the same directory and is renamed into place, so ranks
  sharing a path never leave a torn file).

Loads take a file or a sharded directory.
"""
from __future__ import annotations

import inspect
import os
import shutil
import tempfile
from typing import Any, Dict

import torch
import torch.distributed as dist
from torch import nn


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


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
        raise IsADirectoryError(f"{path} is a directory (a sharded checkpoint?); save to a file path, or save with "
                                "shard=True for a sharded directory")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot save {path}: the directory {directory} does not exist")
    handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.r{rank()}.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
        _fsync_dir(directory)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _fsync_dir(directory: str) -> None:
    """Makes a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    """fsync of a file, or of every file and directory under ``path``."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        return
    for root, _, files in os.walk(path):
        for name in files:
            _fsync_tree(os.path.join(root, name))
        _fsync_dir(root)


# Seconds the other ranks wait for rank 0 to finish writing and renaming a gathered checkpoint.
SAVE_BARRIER_S = 1800.0


def gathers_on_every_rank(io: Any, what: str) -> bool:
    """Whether saving ``what`` (``"model"`` or ``"optimizer"``) through ``io`` (a checkpoint IO, or a Booster holding
    one) is a collective that every rank calls: Gemini's and hybrid parallel's saves gather the shards to rank 0, and
    LowLevelZero's optimizer save gathers its state. Torch DDP's and the general IO's saves, and LowLevelZero's model
    save, write from rank 0 without the others, so a script may call them on rank 0 alone."""
    from colossalai.booster.plugin.gemini_plugin import GeminiCheckpointIO
    from colossalai.booster.plugin.low_level_zero_plugin import LowLevelZeroCheckpointIO
    from colossalai.checkpoint_io import HybridParallelCheckpointIO

    io = getattr(io, "checkpoint_io", io)
    if isinstance(io, (GeminiCheckpointIO, HybridParallelCheckpointIO)):
        return True
    return what == "optimizer" and isinstance(io, LowLevelZeroCheckpointIO)


def booster_save(io: Any, what: str, obj: Any, path: str, shard: bool, **kwargs: Any) -> None:
    """``io.save_model``/``io.save_optimizer`` (a booster's checkpoint IO; every rank calls it) written atomically:
    into ``.saving.<name>`` beside ``path``, then fsynced and renamed over ``path`` by rank 0, so a kill mid-write
    leaves the previous checkpoint whole. A directory already at ``path`` is moved aside (``.replaced.<name>``) for
    the rename and removed after it. Rank 0 is the only writer: the IOs of the data-parallel plugins this engine
    runs gather the state there. Where that gather is a collective (`gathers_on_every_rank`), the ranks then wait
    for rank 0's rename (at most `SAVE_BARRIER_S`), so a load that follows on any rank finds the file; elsewhere no
    wait is added, so a script that saves from rank 0 alone still can."""
    path = os.path.abspath(os.fspath(path))
    save = getattr(io, f"save_{what}")
    if kwargs.get("use_async"):  # the IO finishes the file later: nothing to rename yet
        save(obj, path, shard=shard, **kwargs)
        return
    directory, name = os.path.dirname(path), os.path.basename(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot save {path}: the directory {directory} does not exist")
    if shard and os.path.isfile(path) or not shard and os.path.isdir(path):
        raise (IsADirectoryError if os.path.isdir(path) else FileExistsError)(
            f"save_{what}: {path} is a {'directory' if os.path.isdir(path) else 'file'}; a "
            f"{'sharded' if shard else 'single-file'} save writes a {'directory' if shard else 'file'} there: pick "
            "another path, or save with " + ("shard=False" if shard else "shard=True"))
    tmp, aside = os.path.join(directory, f".saving.{name}"), os.path.join(directory, f".replaced.{name}")
    if rank() == 0:
        _remove(tmp)  # left by a save that was killed
    save(obj, tmp, shard=shard, **kwargs)
    if rank() == 0:
        if not os.path.exists(tmp):
            raise RuntimeError(f"save_{what}: the checkpoint IO wrote nothing at {tmp}")
        _fsync_tree(tmp)
        if os.path.isdir(path):
            _remove(aside)
            os.replace(path, aside)
            os.replace(tmp, path)
            _remove(aside)
        else:
            os.replace(tmp, path)
        _fsync_dir(directory)
    if gathers_on_every_rank(io, what):
        from coati_relay.training.distributed import barrier

        try:
            barrier(SAVE_BARRIER_S)
        except RuntimeError as e:
            raise RuntimeError(f"save_{what}: waiting for every rank after rank 0 wrote {path}: {e}") from e


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def checkpoint_io(booster: Any) -> Any:
    """The booster, or ColossalAI's plain ``GeneralCheckpointIO`` where there is none."""
    if booster is not None:
        return booster
    from colossalai.checkpoint_io import GeneralCheckpointIO

    return GeneralCheckpointIO()


def check_exists(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {what} checkpoint at {path}; when only rank 0 wrote one, load it on every rank "
                                "from a path they share, or save it on every rank")


def save_model(booster: Any, model: nn.Module, state_of: nn.Module, path: str, shard: bool = False,
               every_rank: bool = False, **kwargs: Any) -> None:
    """``state_of``: the module whose state a plain file holds; ``kwargs``: options of the checkpoint IO."""
    if shard and every_rank:
        raise ValueError("save_model: shard=True writes one sharded directory; every_rank=True a file per rank. "
                         "Pass one of them.")
    _save("model", booster, model, state_of, path, shard, every_rank, kwargs)


def load_model(booster: Any, model: nn.Module, path: str, strict: bool = True, map_location: Any = None) -> None:
    check_exists(path, "model")
    if booster is not None or os.path.isdir(path):
        checkpoint_io(booster).load_model(model, path, strict=strict)
        return
    model.load_state_dict(torch.load(path, map_location=map_location or "cpu"), strict=strict)


def save_optimizer(booster: Any, optimizer: Any, path: str, shard: bool = False, every_rank: bool = False,
                   **kwargs: Any) -> None:
    _save("optimizer", booster, optimizer, optimizer, path, shard, every_rank, kwargs)


def _save(what: str, booster: Any, obj: Any, state_of: Any, path: str, shard: bool, every_rank: bool,
          kwargs: Dict[str, Any]) -> None:
    """The booster's checkpoint of ``obj`` (sharded, or one file under a booster unless ``every_rank``), else the
    complete state dict of ``state_of`` in a plain file, written by every rank or by rank 0."""
    if shard or (booster is not None and not every_rank):
        booster_save(checkpoint_io(booster), what, obj, path, shard, **kwargs)
        return
    if kwargs:
        raise TypeError(f"save_{what}: {sorted(kwargs)} apply to the booster's checkpoints (shard=True, or one file "
                        "under a booster); a plain file takes none")
    state = complete_state_dict(state_of)
    if every_rank or rank() == 0:
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


def load_optimizer(booster: Any, optimizer: Any, path: str, map_location: Any = None,
                   replicated: bool = True) -> None:
    """replicated: every rank holds the whole optimizer state (no booster, or torch DDP); sharded directories are
    then read here (ColossalAI's own reader needs a CUDA accelerator)."""
    check_exists(path, "optimizer")
    if os.path.isdir(path) and replicated:
        optimizer.load_state_dict(read_sharded_optimizer(path))
    elif booster is not None:
        booster.load_optimizer(optimizer, path)
    else:
        optimizer.load_state_dict(torch.load(path, map_location=map_location or "cpu"))


class PlainFiles:
    """The checkpoint methods of `TrainingBackend` for a model or optimizer that no backend holds: plain torch files
    of its state as it is (no booster)."""

    def __init__(self, model: Any = None, optimizer: Any = None) -> None:
        self.model, self.optimizer = model, optimizer

    def save_model(self, path: str, shard: bool = False, every_rank: bool = False, **kwargs: Any) -> None:
        save_model(None, self.model, self.model, os.fspath(path), shard, every_rank, **kwargs)

    def load_model(self, path: str, strict: bool = True, map_location: Any = None) -> None:
        load_model(None, self.model, os.fspath(path), strict, map_location)

    def save_optimizer(self, path: str, shard: bool = False, every_rank: bool = False, **kwargs: Any) -> None:
        save_optimizer(None, self.optimizer, os.fspath(path), shard, every_rank, **kwargs)

    def load_optimizer(self, path: str, map_location: Any = None) -> None:
        load_optimizer(None, self.optimizer, os.fspath(path), map_location)
