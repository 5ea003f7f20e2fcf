"""`LivenessProbe`: notices which of a set of named Ray actors have died, without blocking.

Every actor still believed alive has one outstanding probe call. A look (`LivenessProbe.dead`) reaps the calls that
finished: one that returned means the actor was alive (it is probed again on the same look); one that raised
`RayActorError` marks the actor dead for good, keeping the error as its cause. `ActorUnavailableError` (a subclass:
the actor was briefly unreachable, e.g. a node left or it restarts) is not a death: the actor is probed again.

The probe call is ``__ray_ready__`` by default, which every Ray actor has. With ``method="watch"`` (a call pending
for the actor's whole life, `coati_relay.cluster.placement.ServiceActor.watch`) the calls stay outstanding while the
actors
live, so `LivenessProbe.pending` can join a `ray.wait` that must wake up as soon as one of them dies.

`ProducerRoster`: the producers that announced themselves to a consumer, and whether any of them can still send.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional, Set

log = logging.getLogger(__name__)


class NoProducersError(RuntimeError):
    """Every producer feeding a consumer has died or finished, and the consumer has nothing left to take."""


class LivenessProbe:
    """Probes named Ray actor handles; ``dead()`` says which died. Probes nothing (and needs no Ray) when empty.

    handles: name -> Ray actor handle. method: the actor method each probe calls (no arguments).
    """

    def __init__(self, handles: Dict[str, Any], method: str = "__ray_ready__") -> None:
        if not isinstance(method, str) or not method:
            raise ValueError(f"LivenessProbe: method must be the name of an actor method, got {method!r}")
        self.method = method
        self._handles: Dict[str, Any] = {}
        self._probes: Dict[Any, str] = {}  # outstanding probe call -> actor name
        self.causes: Dict[str, BaseException] = {}  # dead actor name -> the error its probe raised
        for name, handle in handles.items():
            self.add(name, handle)

    def add(self, name: str, handle: Any) -> None:
        """Probes ``handle`` under ``name`` (replacing an actor of that name, dead or alive)."""
        if handle is None:
            raise ValueError(f"LivenessProbe: actor {name!r} has no handle; pass its Ray actor handle")
        self._forget(name)
        self._handles[name] = handle
        self._probe(name)

    def remove(self, name: str) -> None:
        """Stops probing ``name`` and forgets it (also its death)."""
        self._forget(name)

    def names(self) -> Set[str]:
        return set(self._handles)

    def pending(self) -> List[Any]:
        """The outstanding probe calls (object refs): a `ray.wait` on them wakes when a probe finishes."""
        return list(self._probes)

    def dead(self, timeout_s: float = 0.0) -> Set[str]:
        """The names of the actors found dead so far. Reaps the probes that finished; waits up to ``timeout_s``
        (0: not at all) for every outstanding probe to finish first."""
        if self._probes:
            import ray

            ready, _ = ray.wait(list(self._probes), num_returns=len(self._probes), timeout=max(0.0, timeout_s))
            for ref in ready:
                self._reap(ref, ray)
        return set(self.causes)

    def _reap(self, ref: Any, ray: Any) -> None:
        name = self._probes.pop(ref)
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.ActorUnavailableError as exc:
            log.warning("actor %s was briefly unreachable (%s); probing it again", name, exc)
        except Exception as exc:  # RayActorError (died), or the probe call itself failed: either way it is gone
            self.causes[name] = exc
            log.warning("actor %s has died: %s", name, type(exc).__name__)
            return
        self._probe(name)

    def _probe(self, name: str) -> None:
        self._probes[getattr(self._handles[name], self.method).remote()] = name

    def _forget(self, name: str) -> None:
        self.causes.pop(name, None)
        self._handles.pop(name, None)
        for ref in [r for r, n in self._probes.items() if n == name]:
            del self._probes[ref]


class ProducerRoster:
    """Producers that announced themselves (``register``) and ended their loop (``finished``); a producer registered
    with a Ray actor handle is also probed for its death. Thread-safe.

    finished_grace_s: how long every producer must have been finished (or dead) before none is expected to send.
    """

    def __init__(self, finished_grace_s: float) -> None:
        if not finished_grace_s >= 0:
            raise ValueError(f"ProducerRoster: finished_grace_s must be >= 0 seconds, got {finished_grace_s!r}")
        self.finished_grace_s = float(finished_grace_s)
        self.probe = LivenessProbe({})
        self._names: Set[str] = set()
        self._finished: Set[str] = set()
        self._all_finished_since: Optional[float] = None
        self._lock = threading.Lock()

    def register(self, name: str, handle: Any = None) -> None:
        """``name`` sends from now on (again); ``handle``: its Ray actor handle, probed for its death."""
        with self._lock:
            self._names.add(name)
            self._finished.discard(name)
            self.probe.remove(name)
            if handle is not None:
                self.probe.add(name, handle)
            self._all_finished_since = None

    def finished(self, name: str) -> None:
        """``name`` ended its loop: it sends nothing more unless it registers again."""
        with self._lock:
            if name in self._names:
                self._finished.add(name)

    def states(self) -> Dict[str, str]:
        """name -> "running" | "finished" | "dead" (looks at the probes without blocking)."""
        with self._lock:
            dead = self.probe.dead()
            return {n: "dead" if n in dead else "finished" if n in self._finished else "running"
                    for n in sorted(self._names)}

    def exhausted(self) -> Optional[Dict[str, str]]:
        """The `states` when producers registered and none can send again: all dead, or all finished or dead with
        the last one finished for ``finished_grace_s``; None otherwise (also when none registered)."""
        states = self.states()
        with self._lock:
            if not states or "running" in states.values():
                self._all_finished_since = None
                return None
            if "finished" in states.values():
                now = time.monotonic()
                self._all_finished_since = self._all_finished_since or now
                if now - self._all_finished_since < self.finished_grace_s:
                    return None
            return states

    def check(self, context: str) -> None:
        """Raises `NoProducersError` (its message: the states, then ``context``) when `exhausted`."""
        states = self.exhausted()
        if states:
            raise NoProducersError(f"no producer can send another batch ({states}); {context}")
