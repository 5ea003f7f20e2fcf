"""RolloutQueue: backpressure, timeouts, staleness, conservation, task board (state and the real Ray actor)."""
from __future__ import annotations

import time

import pytest

from coati_relay.exchange.queue import QueueClosed, QueueEntry, RolloutQueueState, make_rollout_queue
from coati_relay.exchange.task_board import TaskBoard
from coati_relay.observe.metrics import ReportLog


def _conserved(c):
    return c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"]


def test_state_fifo_and_counters():
    q = RolloutQueueState(maxsize=3)
    for v in range(3):
        q.put(QueueEntry(payload=v, version=0, size=2))
    assert q.full()
    out = q.pop(2)
    assert [e.payload for e in out] == [0, 1]
    c = q.counters()
    assert (c["produced"], c["consumed"], c["in_flight"], c["consumed_samples"]) == (3, 2, 1, 4)
    assert _conserved(c)


def test_state_staleness_drops_old_versions():
    q = RolloutQueueState(staleness=1)
    for v in (0, 1, 2, 3):
        q.put(QueueEntry(payload=v, version=v))
    assert [e.version for e in q.drop_stale(consumer_version=3)] == [0, 1]  # older than 3 - 1
    assert [e.version for e in q.entries] == [2, 3]
    assert _conserved(q.counters())


def test_state_no_staleness_bound_keeps_everything():
    q = RolloutQueueState(staleness=None)
    q.put(QueueEntry(payload=0, version=0))
    assert q.drop_stale(consumer_version=100) == []


def test_state_negative_staleness_rejected():
    with pytest.raises(ValueError, match="staleness"):
        RolloutQueueState(staleness=-1)


def test_task_board_hands_out_each_task_once_and_requeues_on_death():
    board, q = TaskBoard(total_tasks=4), RolloutQueueState()
    assert [board.claim("p0"), board.claim("p1"), board.claim("p0")] == [0, 1, 2]
    q.put(QueueEntry(payload="x", version=0, producer="p0", task=0))
    board.finished(0)
    # p0 dies: its queued entry (task 0, whose object died with it) and its claimed task 2 come back.
    assert board.producer_died("p0", q.drop_producer("p0")) == [0, 2]
    c = q.counters()
    assert c["dropped"] == 1 and _conserved(c)
    assert board.counters() == {"tasks_claimed": 1, "tasks_unsettled": 0, "tasks_requeued": 2, "next_task": 3,
                                "dead_producers": ["p0"]}
    assert [board.claim("p1"), board.claim("p1"), board.claim("p1")] == [0, 2, 3]
    assert board.claim("p1") == -1  # tasks still in flight: ask again later
    with pytest.raises(RuntimeError, match="declared dead"):
        board.claim("p0")


def test_task_board_ends_once_every_rollout_is_settled():
    board = TaskBoard(total_tasks=1)
    assert board.claim("p") == 0
    board.finished(0)
    assert board.claim("p") == -1, "queued, not yet fetched: it may still be lost with its producer"
    board.settled([0])
    assert board.claim("p") is None
    assert TaskBoard(total_tasks=3, first_task=2).claim("p") == 2  # a resumed run starts at its first task


def test_report_log_returns_what_the_reader_has_not_seen():
    log = ReportLog()
    log.post({"step": 1})
    log.post({"step": 2})
    assert log.since(0) == [{"step": 1}, {"step": 2}] and log.since(1) == [{"step": 2}] and log.since(2) == []


def test_report_log_forgets_what_the_reader_holds():
    """A long run's log holds the records of one poll, not of the run: reading ``since(n)`` forgets the first n."""
    log = ReportLog()
    for step in range(1, 1001):
        log.post({"step": step})
        if step % 10 == 0:
            assert [r["step"] for r in log.since(step - 10)] == list(range(step - 9, step + 1))
    assert len(log) == 10, "the last poll's records only"
    assert [r["step"] for r in log.since(1000)] == [] and len(log) == 0
    log.post({"step": 1001})
    assert log.since(1000) == [{"step": 1001}]
    with pytest.raises(ValueError, match="forgot"):
        log.since(3)  # already read, and gone
    with pytest.raises(ValueError, match="forgot"):
        log.since(1002)  # more than was posted


@pytest.mark.slow
def test_actor_backpressure_timeout_and_conservation(ray_cluster):
    ray = ray_cluster
    q = make_rollout_queue(maxsize=2, staleness=0)
    refs = [ray.put(i) for i in range(3)]
    for ref in refs[:2]:  # one after the other: concurrent calls into an async actor may interleave
        ray.get(q.put.remote([ref], 0, timeout_s=5))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="put"):
        ray.get(q.put.remote([refs[2]], 0, timeout_s=0.5), timeout=30)
    assert 0.4 < time.monotonic() - t0 < 10
    blocked = q.put.remote([refs[2]], 0, timeout_s=20)  # waits for space
    ready, _ = ray.wait([blocked], timeout=0.5)
    assert not ready, "put on a full queue must block"
    entries = ray.get(q.get.remote(1, timeout_s=5, consumer_version=0), timeout=30)
    assert ray.get(entries[0].payload[0]) == 0  # payloads travel as references
    ray.get(blocked, timeout=30)
    with pytest.raises(TimeoutError, match="get"):
        ray.get(q.get.remote(3, timeout_s=0.5), timeout=30)
    c = ray.get(q.counters.remote())
    assert (c["produced"], c["consumed"], c["in_flight"]) == (3, 1, 2) and _conserved(c)


@pytest.mark.slow
def test_actor_staleness_and_close(ray_cluster):
    ray = ray_cluster
    q = make_rollout_queue(staleness=0, total_tasks=2)
    for v in (0, 1):
        assert ray.get(q.claim_task.remote("p0"), timeout=30) == v
        ray.get(q.put.remote([ray.put(v)], v, producer="p0", task=v, timeout_s=5))
    entries = ray.get(q.get.remote(1, timeout_s=5, consumer_version=1), timeout=30)
    assert [e.version for e in entries] == [1]
    c = ray.get(q.counters.remote())
    assert c["dropped"] == 1 and _conserved(c)
    assert ray.get(q.claim_task.remote("p0"), timeout=30) == 0, "the stale rollout's task is made again"
    waiting = q.get.remote(1, timeout_s=30)
    ray.get(q.close.remote("run failed: producer-0 died"))
    with pytest.raises(QueueClosed, match="producer-0 died"):
        ray.get(waiting, timeout=10)


def test_task_board_requeues_lost_rollouts_once():
    board = TaskBoard(total_tasks=3)
    assert [board.claim("p0"), board.claim("p1")] == [0, 1]
    board.finished(0)
    board.finished(1)
    assert board.requeue([0]) == [0] and board.requeue([0]) == [], "already waiting on the board"
    assert board.claim("p1") == 0, "a lost rollout's task is taken before new ones"
    assert board.requeue([0]) == [], "claimed again: not put back twice"
    assert board.counters()["tasks_requeued"] == 0
    board.settled([1])
    assert board.claim("p0") == 2
    board.finished(0)
    board.finished(2)
    assert board.claim("p0") == -1, "the last rollouts are not yet fetched: the producers stay"
    assert board.requeue([2]) == [2] and board.claim("p0") == 2, "a rollout lost at the very end is made again"
    board.finished(2)
    board.settled([0, 2])
    assert board.claim("p0") is None and board.counters()["tasks_unsettled"] == 0


def test_consumer_replaces_a_rollout_that_died_with_its_producer(ray_cluster, monkeypatch):
    """An entry taken from the queue whose object was lost with its producer's node (stood in for by
    ``unpack_payloads`` answering None for it): its task goes back on the board and the next entry replaces it."""
    from types import SimpleNamespace

    from coati_relay.roles import consumer
    ray = ray_cluster
    q = make_rollout_queue(total_tasks=3)
    refs = {value: ray.put(value) for value in ("lost", "kept", "next")}
    for task, (value, producer) in enumerate((("lost", "p0"), ("kept", "p1"), ("next", "p1"))):
        ray.get(q.put.remote([refs[value]], 0, producer=producer, task=task), timeout=30)
    fetch = consumer.unpack_payloads
    monkeypatch.setattr(consumer, "unpack_payloads",
                        lambda ps, timeout_s: [None if p == [refs["lost"]] else x for p, x in zip(ps, fetch(ps, 10))])
    cfg = SimpleNamespace(roles=SimpleNamespace(timeout_s=10), zero_bubble=False)
    worker = SimpleNamespace(cfg=cfg, queue=q, rank=0)
    entries, rollouts = consumer.ConsumerWorker._take(worker, 2, 0)
    assert rollouts == ["kept", "next"] and [e.task for e in entries] == [1, 2]
    c = ray.get(q.counters.remote(), timeout=30)
    assert c["lost"] == 1 and c["tasks_requeued"] == 1 and c["tasks_unsettled"] == 0, c
    assert ray.get(q.claim_task.remote("p1"), timeout=30) == 0, "the lost rollout's task is produced again"


def test_small_payloads_travel_by_value_and_large_ones_by_reference(ray_cluster):
    """`pack_payload`: a rollout under `INLINE_PAYLOAD_BYTES` becomes its pickled bytes (no object-store entry), a
    larger one ``[ref]``; `unpack_payloads` gives both back, in order, through the real queue actor."""
    import torch

    from coati_relay.exchange.queue import INLINE_PAYLOAD_BYTES, pack_payload, unpack_payloads
    from coati_relay.rollout import Rollout

    def rollout(rows: int, length: int) -> Rollout:
        ids = torch.arange(rows * length).reshape(rows, length)
        return Rollout(ids, torch.ones_like(ids), ids + 1, torch.ones_like(ids, dtype=torch.bool),
                       torch.full(ids.shape, -0.5), torch.full((rows,), length), group_size=2, weight_version=3)

    small, large = rollout(4, 16), rollout(64, 512)
    assert small.nbytes < INLINE_PAYLOAD_BYTES < large.nbytes
    packed = [pack_payload(small, small.nbytes), pack_payload(large, large.nbytes)]
    assert isinstance(packed[0], bytes) and isinstance(packed[1], list)
    assert isinstance(packed[1][0], ray_cluster.ObjectRef)
    q = make_rollout_queue()
    for task, payload in enumerate(packed):
        ray_cluster.get(q.put.remote(payload, 3, 2, "p0", task), timeout=30)
    entries = ray_cluster.get(q.get.remote(2, 10), timeout=30)
    got = unpack_payloads([e.payload for e in entries], 10)
    for want, back in zip((small, large), got):
        assert torch.equal(back.response_ids, want.response_ids) and back.weight_version == 3
        assert torch.equal(back.logprobs, want.logprobs) and back.group_size == 2
