"""`TaskBoard`: which producer runs which task (a micro-batch of prompts, by global index).

Tasks ``first_task .. total_tasks - 1`` are handed out in order; a task is claimed until its rollout is queued
(`finished`), and its rollout is unsettled until a consumer has fetched it (`settled`). When a producer dies, the
tasks it had claimed, and those of its queued rollouts (their objects died with it), go back on the board, and
another producer takes them before any new task. Producers stay while any rollout is unsettled, so a rollout lost
after it left the queue (`requeue`) still finds a producer to make it again.
"""
from __future__ import annotations

import collections
from typing import Any, Deque, Dict, Iterable, List, Optional, Set


class TaskBoard:
    """total_tasks: tasks of the whole run (0: no board); first_task: where a resumed run starts."""

    def __init__(self, total_tasks: int = 0, first_task: int = 0):
        self.total_tasks = total_tasks
        self._next = first_task
        self._requeued: Deque[int] = collections.deque()
        self._claimed: Dict[int, str] = {}
        self._unsettled: Set[int] = set()
        self.dead_producers: Set[str] = set()
        self.closed = False

    def claim(self, producer: str, requeued_only: bool = False) -> Optional[int]:
        """Next task index for ``producer``; -1 when none is free now but others' tasks are still in flight
        (one may come back if its producer dies); None when every task is done.

        requeued_only: take only a task that a dead producer left behind (-1 if there is none).
        """
        if producer in self.dead_producers:
            raise RuntimeError(f"{producer} was declared dead; it may not claim tasks")
        if self._requeued:
            task = self._requeued.popleft()
        elif not requeued_only and self._next < self.total_tasks:
            task = self._next
            self._next += 1
        else:
            busy = self._claimed or self._unsettled or requeued_only
            return -1 if busy and not self.closed else None
        self._claimed[task] = producer
        return task

    def done(self) -> bool:
        """No task is left to claim, now or later (a claim would return None)."""
        return not self._requeued and self._next >= self.total_tasks and not self._claimed and not self._unsettled

    def finished(self, task: Optional[int]) -> None:
        """The rollout of ``task`` is queued: it is no longer claimed, and unsettled until a consumer fetches it."""
        if task is not None:
            self._claimed.pop(task, None)
            self._unsettled.add(task)

    def settled(self, tasks: Iterable[Optional[int]]) -> None:
        """A consumer holds the rollouts of ``tasks``: they can no longer be lost with their producer."""
        self._unsettled.difference_update(tasks)

    def requeue(self, tasks: Iterable[Optional[int]]) -> List[int]:
        """Puts back tasks whose rollouts were lost after they left the queue, except those already waiting on the
        board or claimed again (and None: a rollout of no task); returns the ones put back."""
        tasks = [t for t in tasks if t is not None]
        self._unsettled.difference_update(tasks)
        back = [t for t in tasks if t not in self._requeued and t not in self._claimed]
        self._requeued.extend(back)
        return back

    def producer_died(self, producer: str, queued_tasks: Iterable[int]) -> List[int]:
        """Puts back the tasks ``producer`` had claimed and ``queued_tasks`` (its dropped rollouts); returns them
        sorted. The producer may claim nothing more."""
        self.dead_producers.add(producer)
        lost = [t for t, p in self._claimed.items() if p == producer]
        for t in lost:
            del self._claimed[t]
        queued_tasks = list(queued_tasks)
        self._unsettled.difference_update(queued_tasks)
        lost = sorted(lost + queued_tasks)
        self._requeued.extend(lost)
        return lost

    def counters(self) -> Dict[str, Any]:
        return {"tasks_claimed": len(self._claimed), "tasks_unsettled": len(self._unsettled),
                "tasks_requeued": len(self._requeued), "next_task": self._next,
                "dead_producers": sorted(self.dead_producers)}
