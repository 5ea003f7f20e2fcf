"""LivenessProbe: real tiny Ray actors, one killed with ray.kill, is reported dead within a bounded time."""
from __future__ import annotations

import time

import pytest

from coati_relay.cluster.liveness import LivenessProbe, NoProducersError, ProducerRoster

DEADLINE_S = 15.0


def _dead_within(probe: LivenessProbe, deadline_s: float, poll_s: float = 0.1):
    """Looks (non-blocking) every ``poll_s`` until something is dead; returns (dead names, seconds taken)."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        dead = probe.dead()
        if dead:
            return dead, time.monotonic() - start
        time.sleep(poll_s)
    return set(), time.monotonic() - start


def test_empty_probe_needs_no_ray():
    probe = LivenessProbe({})
    assert probe.dead() == set() and probe.pending() == [] and probe.names() == set()


def test_probe_rejects_a_missing_handle():
    with pytest.raises(ValueError, match="'m0' has no handle"):
        LivenessProbe({"m0": None})


def test_roster_waits_the_grace_period_once_every_producer_finished():
    roster = ProducerRoster(finished_grace_s=0.3)
    assert roster.exhausted() is None  # nobody registered: nothing to expect
    roster.register("p0")
    roster.register("p1")
    roster.finished("p0")
    roster.finished("stranger")  # never registered: ignored
    assert roster.exhausted() is None and roster.states() == {"p0": "finished", "p1": "running"}
    roster.finished("p1")
    assert roster.exhausted() is None  # the grace period starts
    time.sleep(0.35)
    assert roster.exhausted() == {"p0": "finished", "p1": "finished"}
    with pytest.raises(NoProducersError, match=r"'p1': 'finished'\}\); 3 items wait"):
        roster.check("3 items wait")
    roster.register("p1")  # a new loop
    assert roster.exhausted() is None and roster.states()["p1"] == "running"


@pytest.mark.slow
def test_killed_actor_is_reported_dead_and_the_live_one_not(ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Tiny:
        def ping(self):
            return True

    a, b = Tiny.remote(), Tiny.remote()
    ray.get([a.ping.remote(), b.ping.remote()], timeout=60)
    probe = LivenessProbe({"a": a, "b": b})
    start = time.monotonic()
    for _ in range(5):  # probes answered by live actors are reaped and sent again, never reported dead
        assert probe.dead(timeout_s=1.0) == set()
    assert len(probe.pending()) == 2
    ray.kill(a)
    dead, took = _dead_within(probe, DEADLINE_S)
    assert dead == {"a"}, f"after {took:.1f}s: {dead}"
    assert isinstance(probe.causes["a"], ray.exceptions.RayActorError)
    assert probe.dead() == {"a"}  # stays dead; only the live actor is still probed
    assert len(probe.pending()) == 1
    assert time.monotonic() - start < 5 * 1.0 + DEADLINE_S
    probe.remove("a")
    assert probe.dead() == set() and probe.names() == {"b"}
    roster = ProducerRoster(finished_grace_s=3600)  # a death needs no grace period
    roster.register("a", a)
    roster.register("b", b)
    assert roster.exhausted() is None
    ray.kill(b)
    start = time.monotonic()
    while roster.exhausted() is None and time.monotonic() - start < DEADLINE_S:
        time.sleep(0.1)
    assert roster.exhausted() == {"a": "dead", "b": "dead"}
