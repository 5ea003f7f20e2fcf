"""Full weights through one shared-memory file per run, reused across versions: the object-store transport's form
when every process of the run is on the driver's host.

Each version through Ray's object store is a new object, and Ray keeps about 600 bytes in the object's owner (the
consumer) and 40-180 in each process the reference passes through, for as long as the run goes; each new object
also lands on fresh pages of the store. Here a version goes into one of two slots of a file under ``/dev/shm``
instead: version v into slot ``v % 2``, so a producer copying v has a whole round before v + 2 overwrites that slot.
The weight store announces a small `SlotTicket` (passed by value: no Ray object), and the same pages serve every
round.

Each slot has a sequence number that is odd while the slot is written (a seqlock): a reader copies the slot out and
keeps the copy only if the number was even and unchanged around the copy and the slot still holds the announced
version; otherwise it asks the store for the newest version again. The driver, which decides whether a run uses the
file (`shared_weights_path`), removes its name once the consumer and every producer have mapped it (after their
set-up: the pages live on until the last of them exits, so a run killed later leaves nothing in ``/dev/shm``), and
again when the run ends (a file made anew for a new layout).
"""
from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from coati_relay.exchange.packing import FlatMeta, flatten_state_dict, unflatten_state_dict
from coati_relay.exchange.wire import dtype_name

SHM_DIR = Path("/dev/shm")
HEADER_BYTES = 4096  # slot s's (sequence, version) as two int64 at byte 64 * s; the slots start after it
ALIGN = 64  # each dtype's buffer starts on a multiple of this many bytes, so any dtype views it


@dataclass(frozen=True)
class SlotTicket:
    """What the weight store holds for a version written to the file: where it is and how to read it back."""

    path: str
    slot: int
    version: int
    slot_bytes: int  # bytes of one slot; the file holds HEADER_BYTES + 2 * slot_bytes
    offsets: Tuple[Tuple[str, int, int], ...]  # (dtype name, byte offset in the slot, numel) per buffer
    meta: FlatMeta  # as `flatten_state_dict` returns it

    @property
    def file_bytes(self) -> int:
        return HEADER_BYTES + 2 * self.slot_bytes

    @property
    def nbytes(self) -> int:
        """Bytes of the weights (without the alignment)."""
        return sum(numel * getattr(torch, name).itemsize for name, _, numel in self.offsets)


def shared_weights_path(tag: str) -> Optional[str]:
    """The file a run's versions go through (named after ``tag``, the run's project), or None when they must go
    through Ray's object store: more than one Ray node alive, a driver not on the run's node (Ray Client), or no
    writable ``/dev/shm``. Call after ``ray.init``."""
    import ray

    if ray.util.client.ray.is_connected() or not (SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)):
        return None
    alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    if alive != [ray.get_runtime_context().get_node_id()]:
        return None
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", tag)[:40]
    return str(SHM_DIR / f"coati-relay-weights-{tag}-{uuid.uuid4().hex[:8]}")


def remove_shared_weights(path: Optional[str]) -> None:
    """Removes a run's file name (the driver, once every process has mapped it and at the end); nothing when there
    is none."""
    if path:
        Path(path).unlink(missing_ok=True)


def _layout(tensors: Dict[str, torch.Tensor]) -> Tuple[Tuple[Tuple[str, int, int], ...], int]:
    """The buffers `flatten_state_dict` makes of ``tensors`` placed in a slot: ((dtype, byte offset, numel), ...),
    slot bytes."""
    numels: Dict[str, int] = {}
    for t in tensors.values():
        numels[dtype_name(t.dtype)] = numels.get(dtype_name(t.dtype), 0) + t.numel()
    offsets, at = [], 0
    for name, numel in numels.items():
        offsets.append((name, at, numel))
        at += -(-numel * getattr(torch, name).itemsize // ALIGN) * ALIGN
    return tuple(offsets), at


class _Mapped:
    """The file mapped shared (every process sees the same pages): the header as int64 [2, 8] and slot views."""

    def __init__(self, path: str, file_bytes: int):
        self.path, self.file_bytes = path, file_bytes
        self.data = torch.from_file(path, shared=True, size=file_bytes, dtype=torch.uint8)
        self.header = self.data[:2 * ALIGN].view(torch.int64).view(2, ALIGN // 8)

    def buffers(self, slot: int, slot_bytes: int, offsets) -> Dict[str, torch.Tensor]:
        start = HEADER_BYTES + slot * slot_bytes
        out = {}
        for name, offset, numel in offsets:
            dtype = getattr(torch, name)
            out[name] = self.data[start + offset:start + offset + numel * dtype.itemsize].view(dtype)
        return out

    def stamp(self, slot: int) -> Tuple[int, int]:
        """(sequence, version) of ``slot``."""
        return int(self.header[slot, 0]), int(self.header[slot, 1])


class SlotWriter:
    """Consumer rank 0's side: writes each version into the file, two slots taking turns."""

    def __init__(self, path: str):
        self.path = path
        self._mapped: Optional[_Mapped] = None

    @staticmethod
    def room_for(file_bytes: int) -> bool:
        """Whether ``/dev/shm`` can take a file of ``file_bytes`` and keep a tenth of itself (64 MiB at least)
        free for Ray's object store and others."""
        st = os.statvfs(SHM_DIR)
        return st.f_bavail * st.f_frsize - file_bytes >= max(64 << 20, st.f_blocks * st.f_frsize // 10)

    def write(self, version: int, tensors: Dict[str, torch.Tensor]) -> Optional[SlotTicket]:
        """Copies ``tensors`` (HF names; any device) into slot ``version % 2``; returns the ticket announcing it, or
        None when the file is to be made (the first version) and ``/dev/shm`` has no room for it."""
        offsets, slot_bytes = _layout(tensors)
        file_bytes = HEADER_BYTES + 2 * slot_bytes
        if self._mapped is None or self._mapped.file_bytes != file_bytes:
            self._mapped = None
            Path(self.path).unlink(missing_ok=True)  # readers keep their mapping of the old one until they remap
            if not self.room_for(file_bytes):
                return None
            with open(self.path, "wb") as f:  # a new layout (only the first version, in practice): a new file
                f.truncate(file_bytes)
            self._mapped = _Mapped(self.path, file_bytes)
        slot, mapped = version % 2, self._mapped
        mapped.header[slot, 0] += 1  # odd: being written
        _, meta = flatten_state_dict(tensors, into=mapped.buffers(slot, slot_bytes, offsets))
        mapped.header[slot, 1] = version
        mapped.header[slot, 0] += 1  # even: whole
        return SlotTicket(self.path, slot, version, slot_bytes, offsets, meta)


class SlotReader:
    """A producer's side: copies an announced version out of the file into buffers of its own (reused from version
    to version), so a later write cannot change what it returned."""

    def __init__(self):
        self._mapped: Optional[_Mapped] = None
        self._own: Dict[str, torch.Tensor] = {}

    def read(self, ticket: SlotTicket) -> Optional[Dict[str, torch.Tensor]]:
        """The version's tensors (views of this reader's buffers, valid until its next read), or None when the slot
        no longer holds it whole (overwritten by a newer version meanwhile: fetch the newest)."""
        mapped = self._mapped
        if mapped is None or mapped.path != ticket.path or mapped.file_bytes != ticket.file_bytes:
            mapped = self._mapped = _Mapped(ticket.path, ticket.file_bytes)
        seq, version = mapped.stamp(ticket.slot)
        if seq % 2 or version != ticket.version:
            return None
        for name, src in mapped.buffers(ticket.slot, ticket.slot_bytes, ticket.offsets).items():
            own = self._own.get(name)
            if own is None or own.numel() != src.numel():
                own = self._own[name] = torch.empty_like(src)
            own.copy_(src)
        if mapped.stamp(ticket.slot) != (seq, version):
            return None
        return unflatten_state_dict(self._own, ticket.meta)
