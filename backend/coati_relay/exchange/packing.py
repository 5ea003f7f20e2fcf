"""Weights as one flat buffer per dtype: how full weights travel between roles, through Ray's object store or a
shared-memory file.

``flatten_state_dict`` packs a state dict into ``{dtype name: 1-D buffer}`` plus a table of (name, dtype, shape, offset,
numel); ``PackedStateDict`` is that form as Ray stores it without pickling (numpy arrays).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from coati_relay.exchange.wire import Wire, dtype_name, from_wire, to_wire

FlatMeta = List[Tuple[str, str, Tuple[int, ...], int, int]]  # name, dtype, shape, offset, numel


def flatten_state_dict(tensors: Dict[str, torch.Tensor], device: Optional[torch.device] = None,
                       into: Optional[Dict[str, torch.Tensor]] = None) -> Tuple[Dict[str, torch.Tensor], FlatMeta]:
    """Packs tensors into one contiguous 1-D buffer per dtype on ``device`` (default: the CPU). Returns (buffers by
    dtype name, meta). ``into``: the buffers of an earlier call; one of the same dtype, size and device is filled in
    place instead of allocating a new one (a publisher packs the same weights every round)."""
    by_dtype: Dict[str, List[Tuple[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        by_dtype.setdefault(dtype_name(t.dtype), []).append((name, t))
    target = torch.device(device or "cpu")
    buffers: Dict[str, torch.Tensor] = {}
    meta: FlatMeta = []
    for dt, items in by_dtype.items():
        start = len(meta)
        offset = 0
        for name, t in items:
            meta.append((name, dt, tuple(t.shape), offset, t.numel()))
            offset += t.numel()
        old = (into or {}).get(dt)
        reuse = old is not None and old.numel() == offset and old.device == target
        buf = old if reuse else torch.empty(offset, dtype=items[0][1].dtype, device=target)
        with torch.no_grad():
            for (_, t), (_, _, _, off, numel) in zip(items, meta[start:]):
                buf[off:off + numel].copy_(t.detach().reshape(-1))
        buffers[dt] = buf
    return buffers, meta


def unflatten_state_dict(buffers: Dict[str, torch.Tensor], meta: FlatMeta) -> Dict[str, torch.Tensor]:
    """Inverse of `flatten_state_dict` (views into the buffers, no copies)."""
    return {name: buffers[dt][off:off + numel].view(shape) for name, dt, shape, off, numel in meta}


def _to_wire(buffers: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """numpy views of the buffers (`coati_relay.exchange.wire`): Ray stores numpy arrays without pickling and reads
    them back without a copy."""
    return {dt: to_wire(b).array for dt, b in buffers.items()}


def _from_wire(arrays: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """Read-only tensors over the object store's arrays; `load_weights` copies out of them."""
    return {dt: from_wire(Wire(dt, a), copy_read_only=False) for dt, a in arrays.items()}


class PackedStateDict(Mapping):
    """A state dict as one flat buffer per dtype in the form Ray stores and reads back without pickling or copying
    (numpy arrays): what a legacy trainer's weight push puts in the object store once for all its makers. It reads as
    the state dict it packs (a ``Mapping`` of read-only tensor views, unpacked on first use): load it with
    ``load_state_dict`` or copy a tensor before writing to it."""

    def __init__(self, tensors: Dict[str, torch.Tensor], into: Optional[Dict[str, torch.Tensor]] = None):
        self.buffers, self.meta = flatten_state_dict(tensors, into=into)  # `into`: as in flatten_state_dict
        self.arrays = _to_wire(self.buffers)
        self._tensors: Optional[Dict[str, torch.Tensor]] = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def __getstate__(self) -> Dict[str, Any]:
        return {"arrays": self.arrays, "meta": self.meta}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.arrays, self.meta, self._tensors = state["arrays"], state["meta"], None

    def _unpacked(self) -> Dict[str, torch.Tensor]:
        if self._tensors is None:
            self._tensors = unflatten_state_dict(_from_wire(self.arrays), self.meta)
        return self._tensors

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._unpacked()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._unpacked())

    def __len__(self) -> int:
        return len(self.meta)


def put_packed(tensors: Dict[str, torch.Tensor]) -> Tuple[Any, int]:
    """One flat copy of ``tensors`` in the object store, as a `PackedStateDict`: the one form in which weights travel
    through it, from the engine's publisher and from a legacy trainer's push. Returns (ObjectRef, bytes)."""
    import ray

    packed = PackedStateDict(tensors)
    return ray.put(packed), packed.nbytes
