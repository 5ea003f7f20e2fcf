"""`TaskLog`: a producer's last tasks, oldest first, in one array allocated once."""
from __future__ import annotations

import pytest

from coati_relay.observe.task_log import TaskLog


def test_rows_come_back_oldest_first_and_exact():
    log = TaskLog(capacity=4)
    assert log.rows() == [] and len(log) == 0
    log.append(0, 1, 1764331200.123456, 1764331200.654321)
    log.append(1, 1, 1764331201.5, 1764331202.25)
    assert log.rows() == [(0, 1, 1764331200.123456, 1764331200.654321), (1, 1, 1764331201.5, 1764331202.25)]
    assert all(isinstance(x, int) for t, v, *_ in log.rows() for x in (t, v))


def test_a_full_log_keeps_the_last_capacity_tasks_without_growing():
    log = TaskLog(capacity=3)
    buffer = log._rows.ctypes.data
    for task in range(7):
        log.append(task, task // 2, float(task), task + 0.5)
    assert [t for t, *_ in log.rows()] == [4, 5, 6] and len(log) == 3
    assert log.rows()[0] == (4, 2, 4.0, 4.5)
    assert log._rows.ctypes.data == buffer, "the array allocated at the start holds every task"
    with pytest.raises(ValueError, match="capacity"):
        TaskLog(capacity=0)
