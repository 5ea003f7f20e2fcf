"""`RolloutQueue`: the bounded hand-off between producers and consumers.

A small rollout travels inside the queue call as its pickled bytes; a larger one goes to the object store and its
entry holds ``[ref]`` (`pack_payload`, `unpack_payloads`: the producer packs, the consumer unpacks). Every entry
carries the weight version that made it. A producer owns the objects it put, so when it dies its queued entries are
dropped (and counted) and their tasks go back on the board.

Staleness bound ``k``: a consumer at weight version ``v`` accepts entries made by versions ``>= v - k``; older ones
are dropped, counted, and their tasks made again. Conservation holds at every moment:
``produced == consumed + dropped + in_flight``.

`LocalRolloutQueue` is the same hand-off for the threads of one process (the legacy trainer's buffer, which receives
its experience as call arguments): its entries hold the payloads themselves, which never enter the object store.

The queue actor (`RolloutQueueActor`) holds four small parts: this hand-off (`RolloutQueueState`), the `TaskBoard`
producers claim their tasks from (`coati_relay.exchange.task_board`), the `ReportLog` of consumer metrics the driver
reads (`coati_relay.observe.metrics`), and the driver's verdict on each round (two numbers). They are one actor
because each step of the run touches two of them at once, and one actor's calls run one at a time: a put finishes
its task on the board, a get may put stale entries' tasks back on it, a producer's death drops its entries and
requeues their tasks, and a consumer that reports a round then waits for that round's verdict. Split into actors,
each of these would be two calls with a window between them. A colocated run calls the same object in its own
process (`coati_relay.exchange.in_process.InProcessQueue`).
"""
from __future__ import annotations

import asyncio
import collections
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from coati_relay.cluster.placement import SERVICE_ACTOR_OPTIONS, ServiceActor
from coati_relay.cluster.waiting import wait_until
from coati_relay.exchange.task_board import TaskBoard
from coati_relay.observe.metrics import ReportLog


class QueueClosed(RuntimeError):
    """The queue was closed (the run ended or failed); no more entries will come."""


@dataclass
class QueueEntry:
    payload: Any
    version: int
    size: int = 1
    producer: str = ""
    task: Optional[int] = None
    meta: Dict[str, Any] = field(default_factory=dict)
    put_time: float = field(default_factory=time.time)


# A payload whose pickled bytes fit in this many travels by value, inside the queue's calls (Ray inlines call arguments
# and results under its `max_direct_call_object_size`, 100 KiB). Each object passed by reference from its owner
# through the queue actor to a consumer leaves about 0.8 KiB of Ray's bookkeeping behind in those three processes
# after it is freed (Ray 2.x, measured); a payload passed by value leaves none, which keeps a long run of small rounds
# flat (`benchmarks/memory_soak.py`). Large payloads keep the object store: one copy, shared memory.
INLINE_PAYLOAD_BYTES = 64 * 1024


def pack_payload(obj: Any, nbytes: int) -> Any:
    """The queue payload of ``obj`` (about ``nbytes`` of data): its pickled bytes where they fit in
    `INLINE_PAYLOAD_BYTES`, else ``[ref]`` of ``obj`` put in the object store (owned by the caller)."""
    import ray

    if nbytes <= INLINE_PAYLOAD_BYTES:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) <= INLINE_PAYLOAD_BYTES:
            return data
    return [ray.put(obj)]


def unpack_payloads(payloads: List[Any], timeout_s: float) -> List[Any]:
    """The objects of `pack_payload`'s ``payloads``, with None for each one lost with its owner
    (``ObjectLostError``: its producer's node died after the entry left the queue). A payload that is neither
    bytes nor ``[ref]`` (an in-process queue's: the object itself) comes back as it is."""
    refs = [p[0] for p in payloads if isinstance(p, list)]
    by_ref = iter(_get_refs(refs, timeout_s) if refs else [])
    return [pickle.loads(p) if isinstance(p, bytes) else next(by_ref) if isinstance(p, list) else p
            for p in payloads]


def _get_refs(refs: List[Any], timeout_s: float) -> List[Any]:
    """``ray.get`` of each of ``refs``, None for each one lost with its owner."""
    import ray
    from ray.exceptions import ObjectLostError

    try:
        return ray.get(refs, timeout=timeout_s)
    except ObjectLostError:
        fetched = []
        for ref in refs:
            try:
                fetched.append(ray.get(ref, timeout=timeout_s))
            except ObjectLostError:
                fetched.append(None)
        return fetched


class RolloutQueueState:
    """The queue's bookkeeping, without Ray or asyncio (the actor serialises calls).

    maxsize: entries held at most (<= 0: unbounded). staleness: k above (None: no bound).
    """

    def __init__(self, maxsize: int = 0, staleness: Optional[int] = 0):
        if staleness is not None and staleness < 0:
            raise ValueError(f"staleness must be >= 0 or None, got {staleness}")
        self.maxsize = maxsize
        self.staleness = staleness
        self.entries: Deque[QueueEntry] = collections.deque()
        self.produced = self.consumed = self.dropped = self.lost = 0
        self.produced_size = self.consumed_size = self.dropped_size = 0
        self.closed = False
        self.close_reason = ""

    # -- entries ---------------------------------------------------------------------------------------------
    def full(self) -> bool:
        return self.maxsize > 0 and len(self.entries) >= self.maxsize

    def put(self, entry: QueueEntry) -> None:
        if self.closed:
            raise QueueClosed(self.close_reason or "queue closed")
        if self.full():
            raise RuntimeError("RolloutQueueState.put on a full queue; check full() first")
        self.entries.append(entry)
        self.produced += 1
        self.produced_size += entry.size

    def drop_stale(self, consumer_version: Optional[int]) -> List[QueueEntry]:
        """Drops entries older than ``consumer_version - staleness``; returns them."""
        if consumer_version is None or self.staleness is None:
            return []
        oldest_ok = consumer_version - self.staleness
        return self.drop_where(lambda e: e.version < oldest_ok)

    def drop_where(self, dropped: Callable[[QueueEntry], bool]) -> List[QueueEntry]:
        """Drops the entries for which ``dropped(entry)`` holds (counted as dropped); returns them in queue order."""
        kept: Deque[QueueEntry] = collections.deque()
        out = []
        for e in self.entries:
            (out if dropped(e) else kept).append(e)
        self.entries = kept
        self.dropped += len(out)
        self.dropped_size += sum(e.size for e in out)
        return out

    def pop(self, n: int) -> List[QueueEntry]:
        if len(self.entries) < n:
            raise RuntimeError(f"RolloutQueueState.pop({n}) with {len(self.entries)} entries")
        out = [self.entries.popleft() for _ in range(n)]
        self.consumed += n
        self.consumed_size += sum(e.size for e in out)
        return out

    def drop_producer(self, producer: str) -> List[int]:
        """Drops the entries of ``producer`` (objects it put died with it); returns their task indices."""
        return [e.task for e in self.drop_where(lambda e: e.producer == producer) if e.task is not None]

    def counters(self) -> Dict[str, Any]:
        return {
            "produced": self.produced, "consumed": self.consumed, "dropped": self.dropped,
            "in_flight": len(self.entries),
            "produced_samples": self.produced_size, "consumed_samples": self.consumed_size,
            "dropped_samples": self.dropped_size, "lost": self.lost, "closed": self.closed,
        }


class LocalRolloutQueue:
    """`RolloutQueueState` shared by the threads of one process: blocking put and get with timeouts, close, counters.

    maxsize: entries held at most (<= 0: unbounded; `set_maxsize` changes it, waking blocked puts). staleness: as in
    `RolloutQueueState`. Every wait takes a timeout in seconds and raises `TimeoutError` after it; a closed queue
    raises `QueueClosed` to every put and get, waiting or not.
    """

    def __init__(self, maxsize: int = 0, staleness: Optional[int] = None):
        self.state = RolloutQueueState(maxsize, staleness)
        self._changed = threading.Condition()

    def _wait(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Waits (lock held) until ``ready()`` (True) or ``timeout_s`` passed (False); `QueueClosed` once closed."""
        done = self._changed.wait_for(lambda: self.state.closed or ready(), timeout=max(0.0, timeout_s))
        if self.state.closed:
            raise QueueClosed(self.state.close_reason or "queue closed")
        return done

    def _timed_out(self, what: str, timeout_s: float) -> TimeoutError:
        return TimeoutError(f"LocalRolloutQueue: {what} timed out after {timeout_s:.1f}s "
                            f"(counters: {self.counters()})")

    def put(self, entry: QueueEntry, timeout_s: float) -> None:
        """Appends ``entry``; blocks while the queue is full (backpressure)."""
        with self._changed:
            if not self._wait(lambda: not self.state.full(), timeout_s):
                raise self._timed_out(f"put by {entry.producer or 'a producer'}", timeout_s)
            self.state.put(entry)
            self._changed.notify_all()

    def get(self, n: int, timeout_s: float, consumer_version: Optional[int] = None,
            check: Optional[Callable[[], None]] = None, check_every_s: float = 1.0) -> List[QueueEntry]:
        """The ``n`` oldest entries no staler than the bound; blocks until there are ``n``. While it waits,
        ``check()`` runs every ``check_every_s`` (outside the lock) and may raise to end the wait early."""
        if n < 1:
            raise ValueError(f"LocalRolloutQueue.get: n must be >= 1, got {n}")

        def ready() -> bool:
            if self.state.drop_stale(consumer_version):
                self._changed.notify_all()  # room for blocked puts
            return len(self.state.entries) >= n

        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            with self._changed:
                if self._wait(ready, left if check is None else min(left, check_every_s)):
                    out = self.state.pop(n)
                    self._changed.notify_all()
                    return out
            if time.monotonic() >= deadline:
                raise self._timed_out(f"get of {n} entries", timeout_s)
            check()

    def set_maxsize(self, maxsize: int) -> None:
        with self._changed:
            self.state.maxsize = maxsize
            self._changed.notify_all()

    def drop_all(self) -> List[QueueEntry]:
        """Drops every entry (counted as dropped) and returns them."""
        with self._changed:
            dropped = self.state.drop_where(lambda e: True)
            self._changed.notify_all()
            return dropped

    def qsize(self) -> int:
        return len(self.state.entries)

    def counters(self) -> Dict[str, Any]:
        with self._changed:
            return self.state.counters()

    def close(self, reason: str = "") -> None:
        with self._changed:
            self.state.closed, self.state.close_reason = True, reason
            self._changed.notify_all()


class RolloutQueueActor(ServiceActor):
    """Async Ray actor: the hand-off with blocking put/get and timeouts, the task board, the report log (see
    `make_rollout_queue`)."""

    def __init__(self, maxsize: int = 0, staleness: Optional[int] = 0, total_tasks: int = 0, first_task: int = 0,
                 buffer_prompts: int = 0, task_prompts: int = 1):
        self.state = RolloutQueueState(maxsize, staleness)
        self.board = TaskBoard(total_tasks, first_task)
        self.buffer_prompts, self.task_prompts = buffer_prompts, task_prompts  # zero-bubble's data buffer
        self.log = ReportLog()
        self.verdict_step, self.stop_at = -1, None  # the driver's hooks (`coati_relay.callbacks`)
        self._changed = asyncio.Condition()

    async def _wait(self, predicate, timeout_s: Optional[float], what: str) -> None:
        def closed() -> None:
            if self.state.closed:
                raise QueueClosed(self.state.close_reason or "queue closed")

        await wait_until(self._changed, predicate, timeout_s, check=closed, timed_out=lambda: TimeoutError(
            f"RolloutQueue: {what} timed out after {timeout_s:.1f}s (counters: {self.state.counters()})"))

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def put(self, payload: Any, version: int, size: int = 1, producer: str = "",
                  task: Optional[int] = None, timeout_s: Optional[float] = None,
                  meta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Blocks while the queue is full (backpressure); TimeoutError after ``timeout_s``."""
        await self._wait(lambda: not self.state.full(), timeout_s, f"put by {producer or 'producer'}")
        self.state.put(QueueEntry(payload, version, size, producer, task, meta or {}))
        self.board.finished(task)
        await self._notify()
        return self.state.counters()

    async def get(self, n: int = 1, timeout_s: Optional[float] = None,
                  consumer_version: Optional[int] = None) -> List[QueueEntry]:
        """Blocks until ``n`` entries no staler than the bound exist; returns them in FIFO order."""
        if n < 1:
            raise ValueError(f"RolloutQueue.get: n must be >= 1, got {n}")

        def ready() -> bool:
            stale = self.state.drop_stale(consumer_version)
            if stale:  # made again, with newer weights
                self.board.requeue([e.task for e in stale])
                asyncio.get_event_loop().create_task(self._notify())
            return len(self.state.entries) >= n

        await self._wait(ready, timeout_s, f"get of {n} entries")
        out = self.state.pop(n)
        await self._notify()
        return out

    def qsize(self) -> int:
        return len(self.state.entries)

    def buffered_prompts(self) -> int:
        """Prompts claimed by producers or queued, not yet taken by a consumer: what zero-bubble's buffer bounds."""
        return self.board.counters()["tasks_claimed"] * self.task_prompts + sum(e.size for e in self.state.entries)

    def _room(self) -> bool:
        return self.buffer_prompts <= 0 or self.buffered_prompts() < self.buffer_prompts

    def claim_task(self, producer: str, requeued_only: bool = False) -> Optional[int]:
        """As `TaskBoard.claim`; with a zero-bubble buffer (``buffer_prompts`` > 0) a new task only while fewer
        than ``buffer_prompts`` prompts are claimed or queued (-1 otherwise: `wait_room`, then claim again)."""
        if not requeued_only and not self._room() and not self.board.done():
            return -1
        try:
            return self.board.claim(producer, requeued_only)
        except RuntimeError as exc:  # a producer declared dead
            raise QueueClosed(str(exc)) from None

    async def wait_room(self, timeout_s: Optional[float] = None) -> None:
        """Blocks while zero-bubble's buffer is full (returns at once without one, or when no task is left);
        TimeoutError after ``timeout_s``."""
        await self._wait(lambda: self._room() or self.board.done(), timeout_s, "wait for room in the data buffer")

    def report(self, record: Dict[str, Any]) -> None:
        """Consumer rank 0 posts one metrics record per step; the driver reads them with `progress`."""
        self.log.post(record)

    async def set_verdict(self, step: int, stop: bool) -> None:
        """The driver ran its hooks on step ``step``'s report: the consumers may go on (or stop, with ``stop``)."""
        self.verdict_step, self.stop_at = step, (step if stop else self.stop_at)
        await self._notify()

    async def verdict(self, step: int, timeout_s: Optional[float] = None) -> bool:
        """Blocks until the driver has run its hooks on step ``step``; True when the run stops there."""
        await self._wait(lambda: self.verdict_step >= step, timeout_s, f"the driver's hooks on step {step}")
        return self.stop_at == step

    def reports(self, since: int = 0) -> List[Dict[str, Any]]:
        """The reports posted after the first ``since``, which the reader holds and the log forgets."""
        return self.log.since(since)

    def progress(self, since: int = 0) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        """(the reports posted after the first ``since``, the counters): what the driver polls every second. The
        first ``since`` reports are forgotten (the driver holds them): the log holds a poll's worth, not the run."""
        return self.log.since(since), self.counters()

    async def entries_taken(self, fetched: List[Optional[int]], lost: List[Optional[int]]) -> List[int]:
        """A consumer fetched the rollouts of the tasks ``fetched`` (settled: they can no longer be lost), and
        found those of ``lost`` died with their producer: these go back on the board (unless the producer's death
        already put them there). Returns the tasks requeued now."""
        self.board.settled(fetched)
        requeued = self.board.requeue(lost)
        self.state.lost += len(lost)
        await self._notify()
        return requeued

    async def producer_died(self, producer: str) -> List[int]:
        """Drops ``producer``'s entries and puts its tasks back on the board; returns the requeued tasks."""
        lost = self.board.producer_died(producer, self.state.drop_producer(producer))
        await self._notify()
        return lost

    def counters(self) -> Dict[str, Any]:
        return {**self.state.counters(), **self.board.counters()}

    async def close(self, reason: str = "") -> None:
        self.state.closed = self.board.closed = True
        self.state.close_reason = reason
        await self._notify()


def make_rollout_queue(maxsize: int = 0, staleness: Optional[int] = 0, total_tasks: int = 0, first_task: int = 0,
                       name: Optional[str] = None, namespace: Optional[str] = None, buffer_prompts: int = 0,
                       task_prompts: int = 1, **options: Any):
    """Starts a `RolloutQueueActor` (no CPU reserved: it only moves references) and returns its handle.
    ``buffer_prompts``/``task_prompts``: zero-bubble's data buffer in prompts, and the prompts of one task.
    ``options``: more Ray actor options (e.g. a scheduling strategy)."""
    import ray

    opts: Dict[str, Any] = {**SERVICE_ACTOR_OPTIONS, **options}
    if name:
        opts["name"] = name
    if namespace:
        opts["namespace"] = namespace
    return ray.remote(RolloutQueueActor).options(**opts).remote(maxsize, staleness, total_tasks, first_task,
                                                                buffer_prompts, task_prompts)
