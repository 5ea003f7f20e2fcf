"""The checkpoint call forms of both legacy releases (the files are the engine's: atomic per-rank writes in
`coati_relay.training.checkpoint_files`, through each prepared model's `TrainingBackend`).

- Reference version (``b5f056636``), the default: ``save_model(model, path, only_rank0=True)`` writes one file from
  rank 0 (``only_rank0=False``: every rank to its ``path``); ``save_optimizer(optimizer, path, only_rank0=False)``
  the *complete* state from every rank to its ``path`` (ZeRO/Gemini gather it; a shared path holds a file any rank
  can load; ``only_rank0=True``: from rank 0 only). Loads take ``map_location`` third and ``strict`` fourth.
- Final release (``be400a093``) under ``COATI_RELAY_LEGACY_NAMES=final``: the third positional argument of
  ``save_model`` is ``shard`` (``shard=True``: the booster's sharded directory, ``**booster_kwargs`` its options),
  ``save_optimizer`` writes that directory unless ``only_rank0``, and loads take ``strict`` third.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from coati_compat.imports import legacy_switch
from coati_relay.parts import save_file

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
        shard, only_rank0 = (extra[0], only_rank0) if name == "shard" else (shard, extra[0])
    if shard and only_rank0 is False:
        raise ValueError("save_model: shard=True writes one sharded directory (the booster's, from the ranks that "
                         "hold the weights); only_rank0=False asks for a file per rank. Pass one of them.")
    return (True if only_rank0 is None else bool(only_rank0)), bool(shard)


def load_form(extra: Sequence[Any], strict: Optional[bool], map_location: Any) -> Tuple[bool, Any]:
    """``(strict, map_location)`` of a ``load_model`` call (``extra``: the positional arguments after ``path``)."""
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
