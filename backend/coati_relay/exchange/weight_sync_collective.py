"""WeightSync over a collective: consumer rank 0 broadcasts each version to every producer (NCCL where every member
has a GPU of its own, else gloo).

The second implementation of the WeightSync seam (the first puts one copy in the object store). The bytes go rank 0
-> producers over a process group of their own (rank 0: the publishing consumer, rank i+1: producer i), created
directly on a TCP store (hosted by rank 0 on a port bound before anyone is told it, `training.rendezvous`) so that
it lives beside the consumers' data-parallel group. The weight-store actor still
announces each version (its dtype table and sizes), so a producer knows what to receive.

Every producer must receive every version: a thread in each producer joins each broadcast as soon as it is
announced and keeps the newest tensors, which the producer loads between generations. A dead producer therefore
stalls the broadcast until the group's timeout; runs with this sync stop on the first producer failure.
"""
from __future__ import annotations

import datetime
import logging
import socket
import threading
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from coati_relay.exchange.lora_deltas import merge_lora
from coati_relay.exchange.packing import flatten_state_dict, unflatten_state_dict
from coati_relay.exchange.sync_registry import WeightSyncSpec, register_weight_sync
from coati_relay.training.rendezvous import join_store

log = logging.getLogger(__name__)

_POLL_S = 10.0


class WeightGroup:
    """The broadcast group of one member, on ``tcp_store`` (rank 0: `rendezvous.host_store`, the others:
    `rendezvous.join_store`); joining blocks until all ``world_size`` ranks joined. Every member posts
    its CUDA device (`device_identity`), and all pick the same backend from the posts: NCCL (buffers on this
    process's current CUDA device) when every member has a GPU of its own and torch has NCCL, else gloo (host
    memory)."""

    def __init__(self, tcp_store: dist.TCPStore, rank: int, world_size: int, timeout_s: float):
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.PrefixStore("coati-relay-weights", tcp_store)
        store.set(f"cuda/{rank}", device_identity())
        keys = [f"cuda/{r}" for r in range(world_size)]
        store.wait(keys, timeout)
        self.backend = choose_backend([store.get(k).decode() for k in keys], dist.is_nccl_available())
        if self.backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.group = dist.ProcessGroupNCCL(store, rank, world_size, _nccl_options(timeout))
        else:
            self.device = torch.device("cpu")
            self.group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        log.info("weight group rank %d/%d joined over %s", rank, world_size, self.backend)

    def broadcast(self, buffers: Dict[str, torch.Tensor]) -> None:
        """Broadcasts (rank 0) or receives into (others) each buffer (on `device`), as raw bytes: gloo lacks some
        dtypes (bf16)."""
        for dt in sorted(buffers):
            self.group.broadcast(buffers[dt].view(torch.uint8), 0).wait()


def device_identity() -> str:
    """This process's CUDA device as ``host/uuid`` ("" without CUDA): members posting the same one share a GPU."""
    if not torch.cuda.is_available():
        return ""
    index = torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"{socket.gethostname()}/{uuid if uuid is not None else index}"


def choose_backend(member_devices: Sequence[str], nccl_available: bool) -> str:
    """"nccl" when every member has a CUDA device of its own (`device_identity`: none empty, no two equal) and torch
    was built with NCCL, else "gloo". NCCL refuses two ranks on one GPU ("invalid usage"), which a cluster declaring
    one device as several logical GPUs gives a producer and a consumer."""
    own = all(member_devices) and len(set(member_devices)) == len(member_devices)
    return "nccl" if nccl_available and own else "gloo"


def _nccl_options(timeout: datetime.timedelta):
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return options


def _adapters_as_tensors(adapters) -> Tuple[Dict[str, torch.Tensor], Dict[str, float]]:
    tensors, scalings = {}, {}
    for name, (a, b, scaling) in adapters.items():
        tensors[name + "::A"], tensors[name + "::B"] = a, b
        scalings[name] = scaling
    return tensors, scalings


class CollectivePublisher:
    """Consumer rank 0: announce version v in the weight store, then broadcast its bytes. ``tcp_store``: the group's
    store, hosted here (`rendezvous.host_store`), whose port the producers were given."""

    def __init__(self, store, tcp_store: dist.TCPStore, world_size: int, timeout_s: float):
        self.store = store
        self.group = WeightGroup(tcp_store, 0, world_size, timeout_s)

    @property
    def device(self) -> torch.device:
        """Where the consumer hands its weights over: the group's (the GPU under NCCL, no host round trip)."""
        return self.group.device

    def publish(self, version: int, tensors: Optional[Dict[str, torch.Tensor]] = None, adapters=None,
                timeout_s: float = 120.0) -> Dict[str, float]:
        import ray

        if (tensors is None) == (adapters is None):
            raise ValueError("CollectivePublisher.publish: pass exactly one of tensors= or adapters=")
        t0 = time.perf_counter()
        scalings = None
        if adapters is not None:
            tensors, scalings = _adapters_as_tensors(adapters)
        buffers, meta = flatten_state_dict(tensors, device=self.device)
        sizes = {dt: b.numel() for dt, b in buffers.items()}
        nbytes = sum(b.numel() * b.element_size() for b in buffers.values())
        header = ray.put((meta, sizes, scalings))
        kind = "full" if scalings is None else "lora"
        ray.get(self.store.publish.remote(version, [header], kind, nbytes), timeout=timeout_s)
        self.group.broadcast(buffers)
        return {"weight_publish_s": time.perf_counter() - t0, "weight_bytes": float(nbytes)}


class CollectiveSubscriber:
    """Producer i (rank i+1): a thread receives every version; `fetch` hands out the newest one, once. At most one
    version is held at a time: the last one's tensors are dropped before the next one arrives."""

    def __init__(self, store, addr: str, port: int, rank: int, world_size: int, first_version: int,
                 timeout_s: float, base_weights: Optional[Dict[str, torch.Tensor]] = None):
        self.store = store
        self.base_weights = base_weights
        self.timeout_s = timeout_s
        self.group = WeightGroup(join_store(addr, port, world_size, timeout_s), rank, world_size, timeout_s)
        self.last_wait_s = self.last_transfer_s = 0.0
        self._latest: Optional[Tuple[int, Dict[str, torch.Tensor], float]] = None
        self._error: Optional[BaseException] = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._receive_forever, args=(first_version,), daemon=True,
                                        name="coati-relay-weight-receiver")
        self._thread.start()

    def _receive_forever(self, version: int) -> None:
        import ray

        try:
            while True:  # the thread lives as long as its producer actor; each wait is bounded
                try:
                    pub = ray.get(self.store.wait_for.remote(version, _POLL_S), timeout=_POLL_S + 30)
                except TimeoutError:
                    continue
                if pub.version != version:
                    raise RuntimeError(f"collective weight sync: expected version {version}, the store announced "
                                       f"{pub.version}; every version must be broadcast in order")
                meta, sizes, scalings = ray.get(pub.payload[0])
                with self._changed:  # the previous version's tensors go before the next one's arrive
                    if self._latest is not None:
                        self._latest = (self._latest[0], None, self._latest[2])
                t0 = time.perf_counter()
                buffers = {dt: torch.empty(n, dtype=_dtype(dt), device=self.group.device) for dt, n in sizes.items()}
                self.group.broadcast(buffers)
                tensors = unflatten_state_dict(buffers, meta)
                if scalings is not None:
                    tensors = self._merge(tensors, scalings)
                with self._changed:
                    self._latest = (version, tensors, time.perf_counter() - t0)
                    self._changed.notify_all()
                version += 1
        except BaseException as exc:  # surfaces in fetch(); the thread ends with the actor otherwise
            with self._changed:
                self._error = exc
                self._changed.notify_all()

    def _merge(self, tensors: Dict[str, torch.Tensor], scalings: Dict[str, float]) -> Dict[str, torch.Tensor]:
        if self.base_weights is None:
            raise RuntimeError("CollectiveSubscriber: LoRA-only weights published but no base weights were given")
        adapters = {name: (tensors[name + "::A"], tensors[name + "::B"], s) for name, s in scalings.items()}
        return merge_lora(self.base_weights, adapters)

    def fetch(self, min_version: int, timeout_s: float = 300.0) -> Tuple[int, Dict[str, torch.Tensor]]:
        """Blocks (at most ``timeout_s``) until a version ``>= min_version`` arrived; returns the newest."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._error is None and (self._latest is None or self._latest[1] is None or
                                           self._latest[0] < min_version):
                left = deadline - time.monotonic()
                if left <= 0:
                    have = None if self._latest is None else self._latest[0]
                    raise TimeoutError(f"collective weight sync: waited {timeout_s:.1f}s for version >= "
                                       f"{min_version}, newest received is {have}")
                self._changed.wait(timeout=left)
            if self._error is not None:
                raise RuntimeError(f"collective weight sync failed: {self._error}") from self._error
            version, tensors, transfer_s = self._latest
            self._latest = (version, None, transfer_s)  # the caller's now: freed once it loaded them
        self.last_wait_s, self.last_transfer_s = time.perf_counter() - t0, transfer_s
        return version, tensors


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"collective weight sync: unknown dtype {name!r}")
    return dtype


def _publisher(store, *, tcp_store: dist.TCPStore, members: int, timeout_s: float, **_: Any) -> CollectivePublisher:
    return CollectivePublisher(store, tcp_store, members, timeout_s)


def _subscriber(store, *, addr: str, port: int, rank: int, members: int, first_version: int, timeout_s: float,
                base_weights: Optional[Dict[str, torch.Tensor]], **_: Any) -> CollectiveSubscriber:
    return CollectiveSubscriber(store, addr, port, rank, members, first_version, timeout_s, base_weights)


SPEC = register_weight_sync(WeightSyncSpec(
    name="collective", publisher=_publisher, subscriber=_subscriber, needs_port=True,
    producer_loss="needs every producer in every broadcast"))
