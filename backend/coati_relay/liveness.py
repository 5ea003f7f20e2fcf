"""`LivenessProbe`: notices which of a set of named Ray actors have died, without blocking.

Every actor still believed alive has one outstanding probe call. A look (`LivenessProbe.dead`) reaps the calls that
finished: one that returned means the actor was alive (it is probed again on the same look); one that raised
`RayActorError` marks the actor dead for good, keeping the error as its cause. `ActorUnavailableError` (a subclass:
the actor was briefly unreachable, e.g. a node left or it restarts) is not a death: the actor is probed again.

The probe call is ``__ray_ready__`` by default, which every Ray actor has. With ``method="watch"`` (a call pending
for the actor's whole life, `coati_relay.placement.ServiceActor.watch`) the calls stay outstanding while the actors
live, so `LivenessProbe.pending` can join a `ray.wait` that must wake up as soon as one of them dies.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Set

log = logging.getLogger(__name__)


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
