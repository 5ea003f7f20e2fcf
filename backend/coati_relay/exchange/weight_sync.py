"""`ObjectStorePublisher` and `ObjectStoreSubscriber`: the consumer publishes weight version v once; every producer
fetches and loads it.

A published version is one flat buffer per dtype (`coati_relay.exchange.packing`) in the object store, or in a
shared-memory file on one host (`coati_relay.exchange.shared_weights`). LoRA-only sync publishes just the adapters
(``A [r, in]``, ``B [out, r]`` and the scaling per target weight); the producer rebuilds ``W = W0 + scaling * B @ A``
from the base weights it keeps, replacing (never accumulating onto) what it loaded before
(`coati_relay.exchange.lora_deltas`).
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Dict, Optional, Tuple

import torch

from coati_relay.exchange.in_process import InProcessPublisher
from coati_relay.exchange.lora_deltas import merge_lora
from coati_relay.exchange.packing import PackedStateDict
from coati_relay.exchange.publishing import Adapters
from coati_relay.exchange.shared_weights import SlotReader, SlotTicket, SlotWriter
from coati_relay.exchange.sync_registry import WeightSyncSpec, register_weight_sync
from coati_relay.exchange.weight_store import PublishedWeights


class ObjectStorePublisher:
    """Consumer side (a `WeightPublisher`): ``publish(version, tensors)`` packs the weights into host buffers it keeps
    from round to round (the same sizes every round: no new allocation), puts one flat copy in the object store and
    announces it. ``shared_path``: full weights go into that shared-memory file instead, one copy per version all the
    same (`coati_relay.exchange.shared_weights`; the driver names it when the whole run is on its host); a
    ``/dev/shm`` without room for it sends them through the object store."""

    device = None  # weights are copied to the host whatever device they are on, before `publish` returns

    def __init__(self, store, shared_path: Optional[str] = None):
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
        self.store = store
        self._slots = SlotReader()  # reads the versions a publisher wrote to its shared-memory file
        self.base_weights = base_weights  # needed for LoRA-only sync
        self.last_wait_s = self.last_transfer_s = 0.0  # of the latest fetch: waiting for a version, moving bytes

    def fetch(self, min_version: int, timeout_s: float = 300.0) -> Tuple[int, Dict[str, torch.Tensor]]:
        """Blocks (at most ``timeout_s``) for a version ``>= min_version``; returns (version, tensors)."""
        import ray

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


def _publisher(store, *, shared_path: Optional[str], **_: Any) -> ObjectStorePublisher:
    return ObjectStorePublisher(store, shared_path=shared_path)


def _subscriber(store, *, base_weights: Optional[Dict[str, torch.Tensor]], **_: Any) -> ObjectStoreSubscriber:
    return ObjectStoreSubscriber(store, base_weights=base_weights)


SPEC = register_weight_sync(WeightSyncSpec(
    name="object_store", publisher=_publisher, subscriber=_subscriber, shared_memory=True,
    colocated_publisher=InProcessPublisher))
