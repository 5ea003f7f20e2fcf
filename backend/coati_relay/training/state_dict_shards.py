"""A state dict in shards of a byte budget, and the part of one under a submodule's name."""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Iterator, Optional

import torch


def sub_state_dict(state_dict: Dict[str, torch.Tensor], prefix: str) -> Dict[str, torch.Tensor]:
    """The entries of the submodule named ``prefix`` (``"model"``: keys ``model.*``), under their names in it."""
    head = prefix + "."
    return OrderedDict((k[len(head):], v) for k, v in state_dict.items() if k.startswith(head))


def state_dict_shards(state_dict: Dict[str, torch.Tensor],
                      shard_size: Optional[int] = None) -> Iterator[Dict[str, torch.Tensor]]:
    """``state_dict`` in order, in shards of at least ``shard_size`` bytes each but the last (None: one shard)."""
    if shard_size is not None and (isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1):
        raise ValueError(f"shard_size must be a positive number of bytes or None, got {shard_size!r}")
    if shard_size is None:
        yield state_dict
        return
    shard: Dict[str, torch.Tensor] = OrderedDict()
    size = 0
    for name, tensor in state_dict.items():
        shard[name] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= shard_size:
            yield shard
            shard, size = OrderedDict(), 0
    if shard:
        yield shard
