"""The weight-publishing seam: how a trained version leaves the consumer and reaches the producers' engines.

Three pairs fill it, chosen by ``weight_sync`` (its `coati_relay.exchange.sync_registry.WeightSyncSpec`) and the
placement: the object store (`coati_relay.exchange.weight_sync`: ``ObjectStorePublisher`` /
``ObjectStoreSubscriber``), a collective broadcast (`coati_relay.exchange.weight_sync_collective`:
``CollectivePublisher`` / ``CollectiveSubscriber``), and, in a colocated run, the engine in the same process
(`coati_relay.exchange.in_process.InProcessPublisher`, no subscriber). The consumer and producer roles call only
what is declared here.
"""
from __future__ import annotations

from typing import Dict, Optional, Protocol, Tuple, runtime_checkable

import torch

Adapters = Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]  # name -> (A [r, in], B [out, r], scaling)


@runtime_checkable
class WeightPublisher(Protocol):
    """Consumer rank 0's side. ``device``: where the publisher takes the weights from (the GPU for a NCCL
    broadcast, so they are not copied to the host and back); None: any device, the host included."""

    device: Optional[torch.device]

    def publish(self, version: int, tensors: Optional[Dict[str, torch.Tensor]] = None,
                adapters: Optional[Adapters] = None, timeout_s: float = 120.0) -> Dict[str, float]:
        """Hands over ``version``: full weights (``tensors``, HF parameter names) or LoRA adapters (``adapters``),
        exactly one of them. Returns timings in seconds and sizes in bytes (``weight_publish_s``, ...). What it
        sends is copied before it returns: the caller may pass the live weights and step the optimizer after."""
        ...


@runtime_checkable
class WeightSubscriber(Protocol):
    """A producer's side. ``last_wait_s`` / ``last_transfer_s``: of the latest `fetch`, the seconds spent waiting for
    a version and moving its bytes."""

    last_wait_s: float
    last_transfer_s: float

    def fetch(self, min_version: int, timeout_s: float = 300.0) -> Tuple[int, Dict[str, torch.Tensor]]:
        """Blocks (at most ``timeout_s``, then ``TimeoutError``) for a version ``>= min_version``; returns
        (version, full weights ready for `InferenceBackend.load_weights`), LoRA adapters merged on the base."""
        ...
