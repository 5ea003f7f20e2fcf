"""`TaskLog`: what a producer did with its last tasks, in memory that does not grow with the run."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np


class TaskLog:
    """``(task, weight version, start, end)`` (``time.time()`` seconds) of the last ``capacity`` tasks, in one float64
    array ``[capacity, 4]`` allocated once. A deque of tuples held about 190 bytes a task (tracemalloc) until it was
    full: a producer's RSS grew with every round for the first ``capacity`` tasks."""

    def __init__(self, capacity: int = 10_000):
        if capacity < 1:
            raise ValueError(f"TaskLog: capacity must be >= 1, got {capacity}")
        self._rows = np.zeros((capacity, 4), dtype=np.float64)
        self._count = 0

    def append(self, task: int, version: int, start: float, end: float) -> None:
        self._rows[self._count % len(self._rows)] = (task, version, start, end)
        self._count += 1

    def __len__(self) -> int:
        return min(self._count, len(self._rows))

    def rows(self) -> List[Tuple[int, int, float, float]]:
        """The logged tasks, oldest first (the last ``capacity`` of them)."""
        cap, n = len(self._rows), len(self)
        order = np.roll(self._rows, -(self._count % cap), axis=0) if self._count > cap else self._rows[:n]
        return [(int(t), int(v), float(s), float(e)) for t, v, s, e in order.tolist()]
