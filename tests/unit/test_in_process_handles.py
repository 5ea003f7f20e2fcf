"""The in-process handles of a colocated run (`coati_relay.exchange.in_process`): the queue makes rollouts on demand
through the producer's `work_once`, hands reports and verdicts over at once, and the weight handle gives the
consumer's trained version."""
from __future__ import annotations

import ast
import inspect

import pytest

from coati_relay.exchange.in_process import InProcessQueue, TrainedVersions
from coati_relay.roles import colocated


class Producer:
    """`work_once` as the producer's: claims a task, puts its 'rollout' (the task number), returns the task."""

    def __init__(self):
        self.queue = None
        self.made, self.rests = [], 0

    def work_once(self):
        task = self.queue.claim_task("producer-0")
        if task is not None and task >= 0:
            self.queue.put(f"rollout-{task}", 0, 1, "producer-0", task, 5.0)
            self.made.append(task)
        return task

    def rest(self):
        self.rests += 1


def queue_for(producer, total_tasks=6, tasks_per_round=2):
    queue = InProcessQueue(producer.work_once, producer.rest, maxsize=tasks_per_round, staleness=0,
                           total_tasks=total_tasks)
    producer.queue = queue
    return queue


def test_a_get_has_the_producer_make_what_is_missing_then_rest():
    producer = Producer()
    queue = queue_for(producer)
    got = queue.get(2, 5.0, 0)
    assert [e.payload for e in got] == ["rollout-0", "rollout-1"]
    assert producer.made == [0, 1] and producer.rests == 1
    queue.entries_taken([e.task for e in got], [])
    got = queue.get(2, 5.0, 0)
    assert [e.task for e in got] == [2, 3] and producer.rests == 2
    counters = queue.counters()
    assert counters["produced"] == 4 and counters["consumed"] == 4 and counters["in_flight"] == 0


def test_a_get_past_the_last_task_says_so_instead_of_waiting():
    producer = Producer()
    queue = queue_for(producer, total_tasks=2)
    queue.entries_taken([e.task for e in queue.get(2, 5.0, 0)], [])
    with pytest.raises(RuntimeError, match="asks for 2 rollouts, 0 are queued and the producer has no task"):
        queue.get(2, 600.0, 0)


def test_reports_reach_the_driver_at_once_and_its_verdict_answers_the_consumer():
    queue = queue_for(Producer())
    seen = []

    def on_report(record):
        seen.append(record)
        queue.set_verdict(record["step"], record["step"] == 2)

    queue.on_report = on_report
    queue.report({"step": 1})
    assert seen == [{"step": 1}] and queue.verdict(1, 0.1) is False
    queue.report({"step": 2})
    assert queue.verdict(2, 0.1) is True


def test_trained_versions_hand_the_consumers_version_without_tensors():
    trained = {"round": 3}
    versions = TrainedVersions(lambda: trained["round"])
    assert versions.latest_version() == 3
    assert versions.fetch(2) == (3, {}) and versions.fetch(3) == (3, {})
    with pytest.raises(RuntimeError, match="needs weights of version >= 4, but the consumer has trained version 3"):
        versions.fetch(4)


def test_the_colocated_roles_hold_no_loop_of_their_own():
    """Both placements run the roles' own loops (`ConsumerWorker.run`, `ProducerWorker.work_once`)."""
    tree = ast.parse(inspect.getsource(colocated))
    loops = [type(n).__name__ for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))]
    assert loops == []
