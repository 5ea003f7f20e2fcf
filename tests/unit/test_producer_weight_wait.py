"""`ProducerWorker._ensure_version` alone: a fetch that times out lets the producer look for orphaned tasks, but a
load that fails after the subscriber handed a version out ends the wait with the load's own error (a collective
subscriber hands each version out once, so retrying would wait for a version that never comes again)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from coati_relay.roles.producer import ProducerWorker


class HandsOutOnce:
    """A subscriber with the collective one's contract: `fetch` returns the newest version once, then waits."""

    def __init__(self, version: int) -> None:
        self.pending = (version, {"w": torch.ones(2)})
        self.last_transfer_s = 0.0

    def fetch(self, min_version: int, timeout_s: float):
        if self.pending is not None and self.pending[0] >= min_version:
            out, self.pending = self.pending, None
            return out
        time.sleep(min(timeout_s, 0.05))
        raise TimeoutError(f"waited {timeout_s}s for version >= {min_version}")


class Backend:
    def __init__(self, load_error: BaseException = None) -> None:
        self.weight_version, self.loads, self.load_error = 0, [], load_error

    def load_weights(self, version, tensors) -> None:
        self.loads.append(version)
        if self.load_error is not None:
            raise self.load_error
        self.weight_version = version


class NoOrphans:
    def __init__(self) -> None:
        self.claims = 0

    def claim_task(self, name, orphans_only=False):
        self.claims += 1
        return None


def producer(backend: Backend, version: int, timeout_s: float = 3.0) -> ProducerWorker:
    cfg = SimpleNamespace(roles=SimpleNamespace(timeout_s=timeout_s))
    worker = ProducerWorker(0, cfg, queue=NoOrphans(), weight_store=SimpleNamespace(latest_version=lambda: None))
    worker.backend, worker.subscriber = backend, HandsOutOnce(version)
    return worker


def test_a_load_that_times_out_ends_the_wait_with_its_own_error():
    backend = Backend(TimeoutError("load_weights: the engine did not take version 1 within 60s"))
    worker = producer(backend, 1)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="load_weights: the engine did not take version 1"):
        worker._ensure_version(1)
    assert time.monotonic() - t0 < 1.0
    assert backend.loads == [1] and worker.queue.claims == 0  # no orphan hunt, no wait for a version already given


def test_a_fetch_that_times_out_still_looks_for_orphans_and_a_fetched_version_loads():
    backend = Backend()
    worker = producer(backend, 2, timeout_s=0.5)
    worker._ensure_version(2)
    assert backend.loads == [2] and backend.weight_version == 2
    with pytest.raises(TimeoutError, match="no weights of version >= 3 within 0s; is a consumer stuck or dead"):
        worker._ensure_version(3)
    assert worker.queue.claims >= 1
