"""Legacy ``coati.ray.detached_replay_buffer.DetachedReplayBuffer``: the trainer's buffer, on the engine's queue.

Legacy rules kept: items are re-batched to ``sample_batch_size`` (``make_experience_batch``), one queue entry per
batch; the leftover items of a partial batch wait in ``batch_collector`` for later items; ``limit`` counts batches
(0: unbounded); ``get_length()`` counts complete batches only; ``sample()`` returns the oldest batch.

Storage: the engine's `LocalRolloutQueue` in the trainer's process. Experience enters the object store once, as the
arguments of the makers' ``buffer_extend`` calls: no queue actor, no second ``ray.put``. Makers' liveness: the
engine's `coati_relay.cluster.liveness.ProducerRoster`.

Deviations (migration_guide/deviations.md): ``limit`` throttles the makers (``extend`` waits for room, and the makers
wait for ``extend``) while a fit may still consume; after a fit ends the buffer stops throttling, so makers that
produce more than the trainer consumes finish as they did in the legacy code. ``clear()`` works. Leftover items are
counted and reported. ``sample()`` raises `NoProducersError` once every registered maker has died (or finished, after
a grace period) with nothing left to sample, and `TimeoutError` after ``wait_timeout_s``, instead of blocking forever.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List

import torch

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.experience import BufferItem, Experience, make_experience_batch, split_experience_batch
from coati_relay.parts import LocalRolloutQueue, NoProducersError, ProducerRoster, QueueEntry  # noqa: F401 (sample() raises it)

logger = logging.getLogger(__name__)


@deprecated_api("coati.ray.detached_replay_buffer.DetachedReplayBuffer")
class DetachedReplayBuffer:
    """Batches of ``sample_batch_size`` items in a rollout queue, at most ``limit`` of them (0: unbounded).

    Non-legacy keywords: ``wait_timeout_s`` bounds every wait (``sample`` for a batch, ``extend`` for room);
    ``poll_s`` is how often a waiting ``sample`` checks the makers; ``finished_grace_s`` is how long ``sample`` still
    waits once every maker has finished its loop.
    """

    def __init__(self, sample_batch_size: int, limit: int = 0, *, wait_timeout_s: float = 1800.0,
                 poll_s: float = 1.0, finished_grace_s: float = 30.0) -> None:
        for key, value, low in (("sample_batch_size", sample_batch_size, 1), ("limit", limit, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"DetachedReplayBuffer: {key} must be an int >= {low}, got {value!r}")
        for key, value in (("wait_timeout_s", wait_timeout_s), ("poll_s", poll_s)):
            if not value > 0:
                raise ValueError(f"DetachedReplayBuffer: {key} must be > 0, got {value!r}")
        self.sample_batch_size, self.limit = sample_batch_size, limit
        self.wait_timeout_s, self.poll_s = float(wait_timeout_s), float(poll_s)
        self.version = 0  # the trainer's weight version, recorded with every batch it queues
        self.batch_collector: List[BufferItem] = []
        self.dropped_items = 0  # collector items that clear() dropped
        self.items = LocalRolloutQueue(maxsize=limit, staleness=None)  # maxsize 0 once no fit throttles
        self._lock, self._extend_lock = threading.Lock(), threading.Lock()  # extend_lock: one extend at a time
        self.producers = ProducerRoster(finished_grace_s)

    def register_producer(self, name: str, handle: Any = None) -> None:
        """A maker announces that it sends here (``handle``: its Ray actor handle, used to notice its death)."""
        self.producers.register(name, handle)

    def producer_finished(self, name: str) -> None:
        """A maker's working loop has ended; it sends nothing more unless it registers again."""
        self.producers.finished(name)

    def _check_producers(self) -> None:
        """Raises `NoProducersError` when no registered maker can send another batch."""
        if not self.items.qsize():
            self.producers.check(f"the buffer has no batch to sample and {len(self.batch_collector)} items wait for a "
                                 f"batch of {self.sample_batch_size}. Start the makers' workingloop with enough steps "
                                 "for this fit, or lower total_steps")

    @torch.no_grad()
    def append(self, experience: Experience) -> None:
        """Splits a batch into items and extends the buffer with them."""
        self.extend(split_experience_batch(experience))

    @torch.no_grad()
    def extend(self, items: List[BufferItem]) -> None:
        """Adds items; every ``sample_batch_size`` of them become one queued batch, waiting for room under ``limit``."""
        size = self.sample_batch_size
        with self._extend_lock:  # a blocked extend keeps its place in line
            while True:
                with self._lock:  # clear() replaces the collector: the taken items then leave the old one
                    collector = self.batch_collector
                    collector.extend(items)
                    items = []  # added once, on the first pass
                    if len(collector) < size:
                        return
                    batch = make_experience_batch(collector[:size])
                try:
                    self.items.put(QueueEntry(batch, self.version, size), timeout_s=self.wait_timeout_s)
                except TimeoutError:
                    raise TimeoutError(f"the buffer held limit={self.limit} batches for {self.wait_timeout_s:.0f}s "
                                       "and no fit consumed them; call fit(), raise buffer_limit, or use "
                                       "buffer_limit=0") from None
                with self._lock:
                    del collector[:size]

    def sample(self, worker_rank: int = 0, to_device: Any = "cpu") -> Experience:
        """The oldest complete batch, moved to ``to_device``; waits for one (``worker_rank`` is unused, as in the
        legacy code)."""
        try:
            batch = self.items.get(1, self.wait_timeout_s, check=self._check_producers, check_every_s=self.poll_s)[0]
        except TimeoutError:
            raise TimeoutError(f"no batch of {self.sample_batch_size} items arrived within {self.wait_timeout_s:.0f}s; "
                               "are the experience makers running?") from None
        batch.payload.to_device(to_device)
        return batch.payload

    def get_length(self) -> int:
        """Complete batches in the queue (items of a partial batch are not counted)."""
        return self.items.qsize()

    def clear(self) -> None:
        """Empties the buffer: the queued batches and the collector (dropped items are counted and reported)."""
        with self._lock:
            if self.batch_collector:
                logger.warning("clear() drops %d items of a partial batch", len(self.batch_collector))
                self.dropped_items += len(self.batch_collector)
            self.batch_collector = []
            self.items.drop_all()

    def set_throttle(self, on: bool) -> None:
        """Whether ``limit`` holds back producers (on while a fit may consume; off once it has ended)."""
        self.items.set_maxsize(self.limit if on else 0)

    def report_leftover(self) -> int:
        """Logs and returns the number of items waiting in the collector for a full batch."""
        if n := len(self.batch_collector):
            logger.warning("%d items wait for a batch of %d; they are used when more items arrive, lost otherwise",
                           n, self.sample_batch_size)
        return n

    def counters(self) -> Dict[str, Any]:
        """The queue's counters plus ``pending_items`` (collector), ``dropped_items`` and ``sampled_batches``."""
        out = self.items.counters()
        return {**out, "pending_items": len(self.batch_collector), "dropped_items": self.dropped_items,
                "sampled_batches": out["consumed"]}
