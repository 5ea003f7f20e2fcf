"""Legacy ``coati.ray.detached_replay_buffer.DetachedReplayBuffer``: the trainer's buffer, stored in the engine's
rollout queue.

Legacy rules kept: items are re-batched to ``sample_batch_size`` (``make_experience_batch``) and each queue entry is
one whole batch; the leftover items of a partial batch wait in ``batch_collector`` for later items; ``limit`` counts
batches (0: unbounded); ``get_length()`` counts complete batches only; ``sample()`` returns the oldest batch.

Storage: a `coati_relay.rollout_queue` actor (no staleness bound) whose entries are ``[ObjectRef]`` of one batch;
without a Ray session an in-process `RolloutQueueState` holds the batches instead (same bookkeeping).

Deviations (migration_guide/deviations.md): ``limit`` throttles the makers (``extend`` waits for room, and the makers
wait for ``extend``) while a fit may still consume; after a fit ends the buffer stops throttling, so makers that
produce more than the trainer consumes finish as they did in the legacy code. ``clear()`` works. Leftover items are
counted and reported. ``sample()`` raises `NoProducersError` once every registered maker has died (or finished, after
a grace period) with nothing left to sample, and `TimeoutError` after ``wait_timeout_s``, instead of blocking forever.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from coati_compat.deprecations import deprecated_api
from coati_compat.legacy.experience import BufferItem, Experience, make_experience_batch, split_experience_batch
from coati_relay.rollout_queue import QueueEntry, RolloutQueueState

logger = logging.getLogger(__name__)

_RPC_TIMEOUT_S = 60.0


class NoProducersError(RuntimeError):
    """Every experience maker feeding a buffer has died or finished, and the buffer has no batch left."""


class _LocalQueue:
    """The queue's bookkeeping in this process (no Ray session): blocking get with a timeout."""

    def __init__(self) -> None:
        self.state = RolloutQueueState(maxsize=0, staleness=None)
        self._changed = threading.Condition()

    def put(self, batch: Experience, version: int, size: int) -> None:
        with self._changed:
            self.state.put(QueueEntry([batch], version, size))
            self._changed.notify_all()

    def get(self, timeout_s: float) -> Experience:
        with self._changed:
            if not self._changed.wait_for(lambda: self.state.entries or self.state.closed, timeout=timeout_s):
                raise TimeoutError(f"no batch within {timeout_s:.1f}s")
            if not self.state.entries:
                raise RuntimeError(f"buffer queue closed: {self.state.close_reason}")
            return self.state.pop(1)[0].payload[0]

    def qsize(self) -> int:
        return len(self.state.entries)

    def counters(self) -> Dict[str, Any]:
        return self.state.counters()

    def close(self, reason: str) -> None:
        with self._changed:
            self.state.closed, self.state.close_reason = True, reason
            self._changed.notify_all()


class _RayQueue:
    """A `coati_relay.rollout_queue` actor holding ``[ObjectRef]`` of whole batches."""

    def __init__(self) -> None:
        from coati_relay.rollout_queue import make_rollout_queue

        self.actor = make_rollout_queue(maxsize=0, staleness=None)

    def put(self, batch: Experience, version: int, size: int) -> None:
        import ray

        ray.get(self.actor.put.remote([ray.put(batch)], version, size, timeout_s=_RPC_TIMEOUT_S),
                timeout=_RPC_TIMEOUT_S + 10)

    def get(self, timeout_s: float) -> Experience:
        import ray

        entries = ray.get(self.actor.get.remote(1, timeout_s=timeout_s), timeout=timeout_s + _RPC_TIMEOUT_S)
        return ray.get(entries[0].payload[0], timeout=_RPC_TIMEOUT_S)

    def qsize(self) -> int:
        import ray

        return ray.get(self.actor.qsize.remote(), timeout=_RPC_TIMEOUT_S)

    def counters(self) -> Dict[str, Any]:
        import ray

        return ray.get(self.actor.counters.remote(), timeout=_RPC_TIMEOUT_S)

    def close(self, reason: str) -> None:
        import ray

        try:
            ray.get(self.actor.close.remote(reason), timeout=_RPC_TIMEOUT_S)
        finally:
            ray.kill(self.actor)


@dataclass
class _Producer:
    handle: Any
    finished: bool = False
    dead: bool = False
    ping: Any = None


@deprecated_api("coati.ray.detached_replay_buffer.DetachedReplayBuffer")
class DetachedReplayBuffer:
    """Batches of ``sample_batch_size`` items in a rollout queue, at most ``limit`` of them (0: unbounded).

    Non-legacy keywords: ``wait_timeout_s`` bounds every wait (``sample`` for a batch, ``extend`` for room);
    ``poll_s`` is how often a waiting ``sample`` checks the makers; ``finished_grace_s`` is how long ``sample`` still
    waits once every maker has finished its loop; ``use_ray`` picks the storage (None: Ray when a session exists).
    """

    def __init__(self, sample_batch_size: int, limit: int = 0, *, wait_timeout_s: float = 1800.0,
                 poll_s: float = 1.0, finished_grace_s: float = 30.0, use_ray: Optional[bool] = None) -> None:
        for key, value, low in (("sample_batch_size", sample_batch_size, 1), ("limit", limit, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"DetachedReplayBuffer: {key} must be an int >= {low}, got {value!r}")
        for key, value in (("wait_timeout_s", wait_timeout_s), ("poll_s", poll_s)):
            if not value > 0:
                raise ValueError(f"DetachedReplayBuffer: {key} must be > 0, got {value!r}")
        if use_ray is None:
            import ray

            use_ray = ray.is_initialized()
        self.sample_batch_size = sample_batch_size
        self.limit = limit
        self.wait_timeout_s = float(wait_timeout_s)
        self.poll_s = float(poll_s)
        self.finished_grace_s = float(finished_grace_s)
        self.use_ray = bool(use_ray)
        self.version = 0  # the trainer's weight version, recorded with every batch it queues
        self.batch_collector: List[BufferItem] = []
        self.dropped_items = 0
        self.sampled_batches = 0
        self._queued = 0  # complete batches in the queue: every put and get of this buffer goes through here
        self._generation = 0  # bumped by clear()
        self._throttle = True
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._extend_lock = threading.Lock()  # one extend at a time (a blocked one keeps its place in line)
        self._producers: Dict[str, _Producer] = {}
        self._all_finished_since: Optional[float] = None
        self.items = self._new_queue()

    def _new_queue(self):
        return _RayQueue() if self.use_ray else _LocalQueue()

    # -- producers -----------------------------------------------------------------------------------------------
    def register_producer(self, name: str, handle: Any = None) -> None:
        """A maker announces that it sends here (``handle``: its Ray actor handle, used to notice its death)."""
        with self._lock:
            self._producers[name] = _Producer(handle)
            self._all_finished_since = None

    def producer_finished(self, name: str) -> None:
        """A maker's working loop has ended; it sends nothing more unless it registers again."""
        with self._lock:
            if name in self._producers:
                self._producers[name].finished = True

    def _refresh_liveness(self) -> None:
        import ray

        for name, p in self._producers.items():
            if p.dead or p.handle is None:
                continue
            if p.ping is None:
                p.ping = p.handle.__ray_ready__.remote()
            ready, _ = ray.wait([p.ping], timeout=0)
            if not ready:
                continue
            try:
                ray.get(p.ping, timeout=_RPC_TIMEOUT_S)
                p.ping = None
            except ray.exceptions.RayActorError:
                p.dead = True
                logger.warning("experience maker %s has died", name)

    def _check_producers(self) -> None:
        """Raises `NoProducersError` when no registered maker can send another batch."""
        if not self._producers or self._queued > 0:
            return
        if self.use_ray:
            self._refresh_liveness()
        states = {n: "dead" if p.dead else "finished" if p.finished else "running" for n, p in self._producers.items()}
        if "running" in states.values():
            self._all_finished_since = None
            return
        if "finished" in states.values():
            now = time.monotonic()
            self._all_finished_since = self._all_finished_since or now
            if now - self._all_finished_since < self.finished_grace_s:
                return
        raise NoProducersError(
            f"the buffer has no batch to sample and no experience maker can send one ({states}); "
            f"{len(self.batch_collector)} items wait for a batch of {self.sample_batch_size}. Start the makers' "
            "workingloop with enough steps for this fit, or lower total_steps")

    # -- legacy API ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def append(self, experience: Experience) -> None:
        """Splits a batch into items and extends the buffer with them."""
        self.extend(split_experience_batch(experience))

    @torch.no_grad()
    def extend(self, items: List[BufferItem]) -> None:
        """Adds items; every ``sample_batch_size`` of them become one queued batch, waiting for room under ``limit``."""
        with self._extend_lock:
            self._extend(items)

    def _extend(self, items: List[BufferItem]) -> None:
        with self._lock:
            self.batch_collector.extend(items)
        while True:
            with self._lock:
                if len(self.batch_collector) < self.sample_batch_size:
                    return
                batch = make_experience_batch(self.batch_collector[:self.sample_batch_size])
                self._wait_for_room()
                self._queued += 1
                generation, queue = self._generation, self.items
            queue.put(batch, self.version, self.sample_batch_size)
            with self._lock:
                if generation == self._generation:
                    del self.batch_collector[:self.sample_batch_size]

    def _wait_for_room(self) -> None:
        """Blocks (lock held by the caller) while ``limit`` batches are queued and a fit may still consume them."""
        deadline = time.monotonic() + self.wait_timeout_s
        while self.limit and self._throttle and self._queued >= self.limit:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the buffer held limit={self.limit} batches for {self.wait_timeout_s:.0f}s and no "
                                   "fit consumed them; call fit(), raise buffer_limit, or use buffer_limit=0")
            self._room.wait(timeout=min(left, self.poll_s))

    def sample(self, worker_rank: int = 0, to_device: Any = "cpu") -> Experience:
        """The oldest complete batch, moved to ``to_device``; waits for one (``worker_rank`` is unused, as in the
        legacy code)."""
        deadline = time.monotonic() + self.wait_timeout_s
        while True:
            try:
                batch = self.items.get(timeout_s=min(self.poll_s, max(0.01, deadline - time.monotonic())))
                break
            except TimeoutError:
                with self._lock:
                    self._check_producers()
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"no batch of {self.sample_batch_size} items arrived within "
                                       f"{self.wait_timeout_s:.0f}s; are the experience makers running?") from None
        with self._lock:
            self._queued -= 1
            self.sampled_batches += 1
            self._room.notify_all()
        batch.to_device(to_device)
        return batch

    def get_length(self) -> int:
        """Complete batches in the queue (items of a partial batch are not counted)."""
        return self.items.qsize()

    def clear(self) -> None:
        """Empties the buffer: a fresh queue, an empty collector (the dropped items are counted and reported)."""
        with self._lock:
            if self.batch_collector:
                logger.warning("clear() drops %d items of a partial batch", len(self.batch_collector))
                self.dropped_items += len(self.batch_collector)
            old, self.items = self.items, self._new_queue()
            self.batch_collector = []
            self._queued = 0
            self._generation += 1
            self._room.notify_all()
        old.close("cleared")

    # -- non-legacy ----------------------------------------------------------------------------------------------
    def set_throttle(self, on: bool) -> None:
        """Whether ``limit`` holds back producers (on while a fit may consume; off once it has ended)."""
        with self._lock:
            self._throttle = bool(on)
            self._room.notify_all()

    def report_leftover(self) -> int:
        """Logs and returns the number of items waiting in the collector for a full batch."""
        with self._lock:
            n = len(self.batch_collector)
        if n:
            logger.warning("%d items wait for a batch of %d; they are used when more items arrive, lost otherwise",
                           n, self.sample_batch_size)
        return n

    def counters(self) -> Dict[str, Any]:
        """The queue's counters plus ``pending_items`` (collector), ``dropped_items`` and ``sampled_batches``."""
        out = dict(self.items.counters())
        with self._lock:
            out.update(pending_items=len(self.batch_collector), dropped_items=self.dropped_items,
                       sampled_batches=self.sampled_batches)
        return out
