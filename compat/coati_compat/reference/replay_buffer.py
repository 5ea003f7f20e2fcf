"""Reference model of the legacy ``DetachedReplayBuffer`` batching rules (legacy_spec §A.2), in plain Python.

Items are opaque; a batch is the list of ``sample_batch_size`` items it was made of. Where the legacy buffer
blocked, this model records the state instead:

- ``extend`` cuts full batches off the collector in arrival order. A batch that finds the queue at ``limit``
  (> 0) waits in ``blocked`` (the legacy caller thread stayed inside ``put``); ``sample`` then admits it.
- ``sample`` on an empty queue raises ``BufferEmpty`` (the legacy call blocked forever).
- ``get_length`` counts complete queued batches only; leftover items of a partial batch are never flushed.
- ``clear`` empties the queue and then raises AttributeError, as the legacy code did (``tp_world_size``).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Deque, List


class BufferEmpty(RuntimeError):
    """The legacy ``sample()`` would have blocked forever here."""


class LegacyReplayBufferModel:
    def __init__(self, sample_batch_size: int, limit: int = 0) -> None:
        self.sample_batch_size = sample_batch_size
        self.limit = limit
        self.collector: List[Any] = []
        self.queue: Deque[List[Any]] = deque()
        self.blocked: Deque[List[Any]] = deque()

    def _full(self) -> bool:
        return self.limit > 0 and len(self.queue) >= self.limit

    def extend(self, items: List[Any]) -> None:
        self.collector.extend(items)
        while len(self.collector) >= self.sample_batch_size:
            batch = self.collector[: self.sample_batch_size]
            self.collector = self.collector[self.sample_batch_size:]
            if self.blocked or self._full():
                self.blocked.append(batch)
            else:
                self.queue.append(batch)

    def sample(self) -> List[Any]:
        if not self.queue:
            raise BufferEmpty("no complete batch is queued; the legacy sample() would block forever")
        batch = self.queue.popleft()
        while self.blocked and not self._full():
            self.queue.append(self.blocked.popleft())
        return batch

    def get_length(self) -> int:
        return len(self.queue)

    @property
    def producer_blocked(self) -> bool:
        """True while a batch waits for room: the legacy ``buffer_append`` thread was blocked."""
        return bool(self.blocked)

    def clear(self) -> None:
        self.queue.clear()
        raise AttributeError("'DetachedReplayBuffer' object has no attribute 'tp_world_size'")
