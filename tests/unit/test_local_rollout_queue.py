"""LocalRolloutQueue: the rollout queue for the threads of one process (blocking put/get with timeouts, close)."""
from __future__ import annotations

import threading
import time

import pytest

from coati_relay.exchange.queue import LocalRolloutQueue, QueueClosed, QueueEntry


def _entry(k: int, version: int = 0) -> QueueEntry:
    return QueueEntry(payload=k, version=version, size=2)


def _conserved(c) -> bool:
    return c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"]


def _in_thread(fn):
    """Starts ``fn`` in a thread; returns (thread, outcome dict with "result" or "error")."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn()
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_fifo_and_counters():
    q = LocalRolloutQueue()
    for k in range(3):
        q.put(_entry(k), timeout_s=1)
    assert q.qsize() == 3
    assert [e.payload for e in q.get(2, timeout_s=1)] == [0, 1]
    c = q.counters()
    assert (c["produced"], c["consumed"], c["in_flight"], c["consumed_samples"]) == (3, 2, 1, 4) and _conserved(c)


def test_put_blocks_while_full_until_a_get_makes_room():
    q = LocalRolloutQueue(maxsize=1)
    q.put(_entry(0), timeout_s=1)
    thread, outcome = _in_thread(lambda: q.put(_entry(1), timeout_s=10))
    time.sleep(0.3)
    assert thread.is_alive() and q.qsize() == 1
    assert q.get(1, timeout_s=1)[0].payload == 0
    thread.join(timeout=5)
    assert not thread.is_alive() and "error" not in outcome
    assert q.get(1, timeout_s=1)[0].payload == 1


def test_set_maxsize_wakes_a_blocked_put():
    q = LocalRolloutQueue(maxsize=1)
    q.put(_entry(0), timeout_s=1)
    thread, outcome = _in_thread(lambda: q.put(_entry(1), timeout_s=10))
    time.sleep(0.2)
    assert thread.is_alive()
    q.set_maxsize(0)
    thread.join(timeout=5)
    assert not thread.is_alive() and q.qsize() == 2


@pytest.mark.parametrize("side", ["put", "get"])
def test_waits_time_out_within_their_bound(side):
    q = LocalRolloutQueue(maxsize=1)
    q.put(_entry(0), timeout_s=1)
    if side == "get":
        q.get(1, timeout_s=1)
    call = (lambda: q.put(_entry(1), timeout_s=0.3)) if side == "put" else (lambda: q.get(1, timeout_s=0.3))
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=f"{side}.*timed out after 0.3s"):
        call()
    assert 0.25 < time.monotonic() - start < 2


def test_close_wakes_a_waiting_get_and_refuses_puts():
    q = LocalRolloutQueue()
    thread, outcome = _in_thread(lambda: q.get(1, timeout_s=10))
    time.sleep(0.2)
    q.close("run over")
    thread.join(timeout=5)
    assert not thread.is_alive() and isinstance(outcome.get("error"), QueueClosed)
    assert "run over" in str(outcome["error"])
    with pytest.raises(QueueClosed):
        q.put(_entry(0), timeout_s=1)
    assert q.counters()["closed"]


def test_check_runs_while_get_waits_and_can_end_it():
    q = LocalRolloutQueue()
    calls = []

    def check():
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise RuntimeError("nobody left")

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="nobody left"):
        q.get(1, timeout_s=10, check=check, check_every_s=0.1)
    assert len(calls) == 3 and time.monotonic() - start < 2
    q.put(_entry(5), timeout_s=1)
    assert q.get(1, timeout_s=0.2, check=check, check_every_s=0.1)[0].payload == 5 and len(calls) == 3


def test_stale_entries_are_dropped_by_get():
    q = LocalRolloutQueue(staleness=1)
    for v in (0, 1, 2, 3):
        q.put(_entry(v, version=v), timeout_s=1)
    assert [e.version for e in q.get(2, timeout_s=1, consumer_version=3)] == [2, 3]
    c = q.counters()
    assert c["dropped"] == 2 and _conserved(c)


def test_drop_all_counts_what_it_drops_and_makes_room():
    q = LocalRolloutQueue(maxsize=2)
    for k in range(2):
        q.put(_entry(k), timeout_s=1)
    assert [e.payload for e in q.drop_all()] == [0, 1]
    q.put(_entry(2), timeout_s=0.1)  # room again, no wait
    c = q.counters()
    assert (c["dropped"], c["dropped_samples"], c["in_flight"]) == (2, 4, 1) and _conserved(c)
