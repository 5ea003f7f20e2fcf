"""`WeightSync`: the consumer publishes weight version v once; every producer fetches and loads it.

A published version is one flat buffer per dtype in the object store plus a small table of (name, dtype, shape,
offset). LoRA-only sync publishes just the adapters
(``A [r, in]``, ``B [out, r]`` and the scaling per target weight); the producer rebuilds ``W = W0 + scaling * B @ A``
from the base weights it keeps, replacing (never accumulating onto) what it loaded before.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from coati_relay.exchange.publishing import Adapters
from coati_relay.exchange.weight_store import PublishedWeights

FlatMeta = List[Tuple[str, str, Tuple[int, ...], int, int]]  # name, dtype, shape, offset, numel


def dtype_name(dtype: torch.dtype) -> str:
    """The key of a dtype's buffer: "float32", "bfloat16", ..."""
    return str(dtype).replace("torch.", "")


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
    """numpy views of the buffers: Ray stores numpy arrays without pickling and reads them back without a copy
    (torch tensors are pickled both ways). bfloat16, which numpy lacks, travels as int16 bits."""
    return {dt: (b.view(torch.int16) if b.dtype == torch.bfloat16 else b).numpy() for dt, b in buffers.items()}


def _from_wire(arrays: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """Read-only tensors over the object store's arrays; `load_weights` copies out of them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        out = {dt: torch.from_numpy(a) for dt, a in arrays.items()}
    return {dt: (t.view(torch.bfloat16) if dt == "bfloat16" else t) for dt, t in out.items()}


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


def lora_adapters(model: torch.nn.Module) -> Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]:
    """Adapters of a peft-wrapped model keyed by the HF name of the weight they modify.

    Returns {"model.layers.0.self_attn.q_proj.weight": (A [r, in], B [out, r], scaling)}.
    """
    out: Dict[str, Tuple[torch.Tensor, torch.Tensor, float]] = {}
    for name, module in model.named_modules():
        if not (hasattr(module, "lora_A") and hasattr(module, "scaling") and hasattr(module, "base_layer")):
            continue
        for adapter, lin_a in module.lora_A.items():
            lin_b = module.lora_B[adapter]
            hf_name = name
            for prefix in ("base_model.model.", "module."):
                if hf_name.startswith(prefix):
                    hf_name = hf_name[len(prefix):]
            out[hf_name + ".weight"] = (lin_a.weight.detach().cpu(), lin_b.weight.detach().cpu(),
                                        float(module.scaling[adapter]))
    return out


def lora_delta(a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """``scaling * B @ A`` in float32: A [r, in], B [out, r] -> [out, in]."""
    return scaling * (b.float() @ a.float())


def replace_delta(w0: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``W0 + delta`` in W0's dtype and device: the one way a LoRA push lands, on the engine's producers and on the
    legacy makers alike. Always from the base ``W0``, so a new push replaces the previous delta, never adds to it."""
    return (w0.float() + delta.to(device=w0.device, dtype=torch.float32)).to(w0.dtype)


def merge_lora(base: Dict[str, torch.Tensor],
               adapters: Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]) -> Dict[str, torch.Tensor]:
    """``W = W0 + scaling * B @ A`` for each adapted weight; W0 comes from ``base`` and is never modified."""
    merged = {}
    for name, (a, b, scaling) in adapters.items():
        if name not in base:
            raise KeyError(f"merge_lora: adapter for {name!r} but the base weights have no such tensor")
        merged[name] = replace_delta(base[name], lora_delta(a, b, scaling))
    return merged


class ObjectStorePublisher:
    """Consumer side (a `WeightPublisher`): ``publish(version, tensors)`` packs the weights into host buffers it keeps
    from round to round (the same sizes every round: no new allocation), puts one flat copy in the object store and
    announces it. ``shared_path``: full weights go into that shared-memory file instead, one copy per version all the
    same (`coati_relay.exchange.shared_weights`; the driver names it when the whole run is on its host); a
    ``/dev/shm`` without room for it sends them through the object store."""

    device = None  # weights are copied to the host whatever device they are on, before `publish` returns

    def __init__(self, store, shared_path: Optional[str] = None):
        from coati_relay.exchange.shared_weights import SlotWriter

        self.store = store
        self._host: Optional[Dict[str, torch.Tensor]] = None  # the buffers the last version was packed into
        self.slots = SlotWriter(shared_path) if shared_path else None

    def _put_full(self, version: int, tensors: Dict[str, torch.Tensor]) -> Tuple[Any, int]:
        """(what the store announces: an ObjectRef or a `SlotTicket`, bytes)."""
        import ray

        if self.slots is not None:
            ticket = self.slots.write(version, tensors)
            if ticket is not None:
                return ticket, ticket.nbytes
            warnings.warn("/dev/shm has no room for two copies of the weights: they go through Ray's object store for "
                          "the rest of the run", RuntimeWarning, stacklevel=3)
            self.slots = None
        packed = PackedStateDict(tensors, into=self._host)  # `ray.put` copies it: the buffers can be reused
        self._host = packed.buffers
        return ray.put(packed), packed.nbytes

    def publish(self, version: int, tensors: Dict[str, torch.Tensor] | None = None,
                adapters: Adapters | None = None,
                timeout_s: float = 120.0) -> Dict[str, float]:
        """Publishes full weights (``tensors``) or LoRA adapters (``adapters``). Returns timing and size."""
        import ray

        if (tensors is None) == (adapters is None):
            raise ValueError("ObjectStorePublisher.publish: pass exactly one of tensors= or adapters=")
        t0 = time.perf_counter()
        if tensors is not None:
            payload, nbytes = self._put_full(version, tensors)
            kind = "full"
        else:
            kind = "lora"
            payload = ray.put(adapters)
            nbytes = sum((a.numel() + b.numel()) * a.element_size() for a, b, _ in adapters.values())
        ray.get(self.store.publish.remote(version, [payload], kind, nbytes), timeout=timeout_s)
        return {"weight_publish_s": time.perf_counter() - t0, "weight_bytes": float(nbytes)}


class ObjectStoreSubscriber:
    """Producer side (a `WeightSubscriber`): fetches a published version and turns it into tensors ready for
    `load_weights`."""

    def __init__(self, store, base_weights: Optional[Dict[str, torch.Tensor]] = None):
        from coati_relay.exchange.shared_weights import SlotReader

        self.store = store
        self._slots = SlotReader()  # reads the versions a publisher wrote to its shared-memory file
        self.base_weights = base_weights  # needed for LoRA-only sync
        self.last_wait_s = self.last_transfer_s = 0.0  # of the latest fetch: waiting for a version, moving bytes

    def fetch(self, min_version: int, timeout_s: float = 300.0) -> Tuple[int, Dict[str, torch.Tensor]]:
        """Blocks (at most ``timeout_s``) for a version ``>= min_version``; returns (version, tensors)."""
        import ray

        from coati_relay.exchange.shared_weights import SlotTicket

        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(deadline - time.monotonic(), 0.0)
            pub: PublishedWeights = ray.get(self.store.wait_for.remote(min_version, left), timeout=left + 30)
            t1 = time.perf_counter()
            if not isinstance(pub.payload[0], SlotTicket):
                payload = ray.get(pub.payload[0], timeout=timeout_s)
                break
            payload = self._slots.read(pub.payload[0])
            if payload is not None:
                break
            if time.monotonic() >= deadline:  # overwritten as it was read, and no time left for the newest
                raise TimeoutError(f"ObjectStoreSubscriber: version {pub.version} was overwritten while it was read, "
                                   f"and {timeout_s:.0f}s have passed")
        self.last_wait_s, self.last_transfer_s = t1 - t0, time.perf_counter() - t1
        if pub.kind == "full":
            return pub.version, dict(payload)
        if self.base_weights is None:
            raise RuntimeError("ObjectStoreSubscriber: LoRA-only weights published but no base weights were given")
        return pub.version, merge_lora(self.base_weights, payload)
