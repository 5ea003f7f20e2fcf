"""The in-process handles of a colocated run, where the producer and the consumer share the driver's process and run
the same loops as in a disaggregated run (`ProducerWorker.work_once`, `ConsumerWorker.run`):

- `InProcessQueue` in place of the queue actor: the same hand-off, task board and verdicts, called directly, and
  the producer made to work when the consumer asks for rollouts (one thread: nothing runs beside training);
- `TrainedVersions` in place of the weight store and the producer's subscriber: the version the consumer trained;
- `InProcessPublisher`, the consumer's publisher where the inference backend holds its own copy of the weights
  (vLLM): each version goes straight to ``backend.load_weights``.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from coati_relay.exchange.publishing import Adapters
from coati_relay.exchange.queue import QueueEntry, RolloutQueueActor


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


class TrainedVersions:
    """A colocated producer's weight store and `WeightSubscriber` at once: ``trained()`` is the version the consumer
    in this process has trained. Nothing travels: an engine with its own copy was loaded as each version was
    published (`InProcessPublisher`), and a backend that generates in place reads the trained weights where they
    are, so a fetch hands it the version with no tensors."""

    last_wait_s = last_transfer_s = 0.0

    def __init__(self, trained: Callable[[], int]) -> None:
        self.trained = trained

    def latest_version(self) -> int:
        return self.trained()

    def fetch(self, min_version: int, timeout_s: float = 300.0) -> Tuple[int, Dict[str, torch.Tensor]]:
        """(the trained version, no tensors); a version not trained yet raises, since nothing else in this process
        could train it while the producer waited."""
        version = self.trained()
        if version < min_version:
            raise RuntimeError(f"colocated run: the producer needs weights of version >= {min_version}, but the "
                               f"consumer has trained version {version} only")
        return version, {}


class InProcessQueue:
    """A colocated run's rollout queue: the queue actor's object (`RolloutQueueActor`: hand-off, task board, verdicts)
    called in this process, its waits on a private event loop. When the consumer asks for more entries than are
    queued, ``produce()`` (the producer's `work_once`) runs until they are there, then ``rest()`` (its backend's
    ``sleep``: vLLM hands its memory to training). Reports go to ``on_report`` at once; the driver sets it and gives
    each round's verdict (`set_verdict`) from there, before the consumer asks for it."""

    def __init__(self, produce: Callable[[], Optional[int]], rest: Callable[[], None], **bounds: Any) -> None:
        self.actor = RolloutQueueActor(**bounds)
        self.produce, self.rest = produce, rest
        self.on_report: Callable[[Dict[str, Any]], None] = lambda record: None
        self._loop = asyncio.new_event_loop()

    def _done(self, result: Any) -> Any:
        return self._loop.run_until_complete(result) if inspect.isawaitable(result) else result

    def get(self, n: int = 1, timeout_s: Optional[float] = None,
            consumer_version: Optional[int] = None) -> List[QueueEntry]:
        """``n`` entries, made first where fewer are queued."""
        made = False
        while self.actor.qsize() < n:
            task = self.produce()
            if task is None or task < 0:
                raise RuntimeError(f"colocated run: the consumer asks for {n} rollouts, {self.actor.qsize()} are "
                                   f"queued and the producer has no task to make (queue: {self.counters()})")
            made = True
        if made:
            self.rest()
        return self._done(self.actor.get(n, timeout_s, consumer_version))

    def report(self, record: Dict[str, Any]) -> None:
        self.on_report(record)

    def close(self, reason: str = "") -> None:
        """Closes the queue (its waits raise `QueueClosed`) and its event loop."""
        self._done(self.actor.close(reason))
        self._loop.close()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """The actor's other methods (``put``, ``claim_task``, ``verdict``, ...), their waits run to the end."""
        if name.startswith("_"):  # copy and pickle probe for these; the actor's are not this handle's
            raise AttributeError(name)
        method = getattr(self.actor, name)
        return lambda *args, **kwargs: self._done(method(*args, **kwargs))
