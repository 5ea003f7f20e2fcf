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

The files themselves are the engine's (`coati_relay.training.checkpoint_files`, through each prepared model's
`TrainingBackend`): per-rank files are written to a temporary name and renamed into place, so ranks sharing one path
never leave a torn file. Loads take a file or a sharded directory; ``map_location`` (reference form) or ``strict``
(final form) may come third.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from coati_compat import legacy_switch
from coati_relay.training.checkpoint_files import save_file

__all__ = ["load_form", "model_save_form", "optimizer_save_form", "save_file"]


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


def optimizer_save_form(only_rank0: bool, kwargs: Dict[str, Any]) -> Tuple[bool, bool]:
    """``(shard, every_rank)`` of a ``save_optimizer`` call: the final release wrote the booster's sharded directory
    unless ``only_rank0``; the reference version a complete file per rank (``only_rank0``: from rank 0 alone)."""
    if legacy_switch.final_release():
        return not only_rank0, False
    if kwargs:
        raise TypeError(f"save_optimizer: {sorted(kwargs)} apply to the booster's sharded checkpoint "
                        "(COATI_RELAY_LEGACY_NAMES=final); the legacy per-rank file takes none")
    return False, not only_rank0
