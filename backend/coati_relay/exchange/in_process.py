"""`InProcessPublisher`: a colocated run's consumer hands each trained version straight to the inference backend in
its own process (one holding its own copy of the weights, such as vLLM)."""
from __future__ import annotations

import time
from typing import Any, Dict, Optional

import torch

from coati_relay.exchange.publishing import Adapters


class InProcessPublisher:
    """The consumer's `WeightPublisher` in a colocated run whose inference backend holds its own copy of the weights
    (vLLM): each version goes straight to ``backend.load_weights``, in this process."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    device = None  # the engine loads weights from any device

    def publish(self, version: int, tensors: Optional[Dict[str, torch.Tensor]] = None,
                adapters: Optional[Adapters] = None, timeout_s: float = 120.0) -> Dict[str, float]:
        """Loads full weights (``tensors``, HF names) as ``version``; returns the seconds it took. ``timeout_s`` is
        the seam's: an in-process load does not wait on anyone."""
        if tensors is None or adapters is not None:
            raise ValueError("InProcessPublisher.publish: a colocated run publishes full weights (tensors=) only")
        t0 = time.perf_counter()
        if self.backend.sleeps:  # an engine asleep during training gets its memory back first
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # what training cached and no longer holds
            self.backend.wake_up()
        self.backend.load_weights(version, tensors)
        return {"weight_publish_s": time.perf_counter() - t0}
