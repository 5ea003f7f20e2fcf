"""The weight syncs by name: each registers one `WeightSyncSpec`, and the config checks, the driver, the consumer and
the producer look it up by ``weight_sync`` (`weight_sync_spec`) instead of comparing names.

The built-in ones register where they are written: ``"object_store"`` in `coati_relay.exchange.weight_sync`,
``"collective"`` in `coati_relay.exchange.weight_sync_collective`. Adding one is a spec like theirs passed to
`register_weight_sync`.

A registration holds in the process that makes it: the driver's checks and a colocated run (in the driver's
process) see it, but a disaggregated run's Ray actors import only the built-in ones (`coati_relay.exchange`
imports them), so a new weight sync reaches them only from a module they import too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from coati_relay.exchange.publishing import WeightPublisher, WeightSubscriber


@dataclass(frozen=True)
class WeightSyncSpec:
    """What the engine knows about one weight sync.

    name: the ``weight_sync`` value.
    publisher: ``publisher(store, *, tcp_store, shared_path, members, timeout_s)`` -> consumer rank 0's
      `WeightPublisher`. ``store``: the weight-store actor; ``tcp_store``: the store rank 0 hosts for the sync where
      ``needs_port``, else None; ``shared_path``: the shared-memory file the driver named where ``shared_memory`` and
      the run is on one host, else None; ``members``: the producers and the publisher.
    subscriber: ``subscriber(store, *, addr, port, rank, members, first_version, timeout_s, base_weights)`` -> a
      producer's `WeightSubscriber`. ``addr``, ``port``: where rank 0 hosts the sync's store (port 0 without one);
      ``rank``: the producer's index + 1; ``first_version``: the version it starts from; ``base_weights``: the base
      model's (HF name -> tensor) where only LoRA adapters are published, else None.
    needs_port: consumer rank 0 hosts a store for the sync on a port it binds at the rendezvous.
    shared_memory: full weights may travel through a shared-memory file when the whole run is on one host.
    producer_loss: why a run with it cannot go on after a producer dies (``on_producer_failure='continue'``); None:
      it can.
    colocated_publisher: ``colocated_publisher(backend)`` -> the `WeightPublisher` a colocated run hands each trained
      version through to an inference backend in this process holding its own copy; None: it cannot run colocated.
    """

    name: str
    publisher: Callable[..., WeightPublisher]
    subscriber: Callable[..., WeightSubscriber]
    needs_port: bool = False
    shared_memory: bool = False
    producer_loss: Optional[str] = None
    colocated_publisher: Optional[Callable[[Any], WeightPublisher]] = None


_SYNCS: Dict[str, WeightSyncSpec] = {}


def register_weight_sync(spec: WeightSyncSpec) -> WeightSyncSpec:
    """Makes ``spec`` the weight sync named ``spec.name``; a taken name raises."""
    if spec.name in _SYNCS:
        raise ValueError(f"weight sync {spec.name!r} is registered already")
    _SYNCS[spec.name] = spec
    return spec


def weight_sync_names() -> Tuple[str, ...]:
    """The registered names, in the order they were registered."""
    return tuple(_SYNCS)


def find_weight_sync(name: Any) -> Optional[WeightSyncSpec]:
    """The spec registered as ``name``, or None."""
    return _SYNCS.get(name) if isinstance(name, str) else None


def weight_sync_spec(name: str) -> WeightSyncSpec:
    """The spec registered as ``name``; an unknown name raises a ValueError naming the registered ones."""
    spec = find_weight_sync(name)
    if spec is None:
        raise ValueError(f"unknown weight_sync {name!r}; choose one of {list(_SYNCS)}")
    return spec
