"""What each rank of the consumers' data-parallel group is doing, so that a collective that cannot complete ends the
run with an error naming the ranks, the round, the step and the phase, instead of a transport timeout.

Two timeouts bound the group's waits:
- ``collective_timeout_s`` (default 60 s) bounds every collective of a step (log-probs, backward, optimizer step,
  weight publish): the ranks enter a round's training together, so inside it one rank waits for another only as
  long as their compute differs, and a longer wait is a fault (a stuck or dead rank, ranks that disagree);
- ``timeout_s`` bounds the round gate (`RankPhases.gate`), where the ranks meet after receiving their rollouts:
  producers may deliver one rank's share long after another's, and that is no fault.

Each rank writes its current phase to the group's rendezvous store; a rank whose collective fails reads the others'
and names them (`CollectiveTimeout`).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import time
from typing import Any, Dict, Iterator, List, Optional

import torch.distributed as dist

log = logging.getLogger(__name__)

PHASES = ("gate", "log-probs", "backward", "optimizer step", "weight publish", "checkpoint")

# What torch raises when a collective of the group cannot complete: gloo's transport timeout, a peer that died
# (connection closed or reset), NCCL's watchdog (DistBackendError).
_COLLECTIVE_FAILURES = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe",
                        "no route to host", "connection refused")


class CollectiveTimeout(RuntimeError):
    """A collective of the consumers' group failed or timed out; the message names this rank's phase and the last
    phase every other rank reported."""


_TIMEOUT_S: Optional[float] = None  # what `set_collective_timeout` last set (None: the group's own)


def set_collective_timeout(timeout_s: float) -> None:
    """Bounds every later collective of the default group by ``timeout_s`` (gloo and NCCL)."""
    global _TIMEOUT_S
    if dist.is_initialized():
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(datetime.timedelta(seconds=timeout_s))
        _TIMEOUT_S = timeout_s


@contextlib.contextmanager
def longer_timeout(timeout_s: float) -> Iterator[None]:
    """The default group's collectives bounded by ``timeout_s`` inside the block (a barrier where one rank writes
    files), by the collective timeout again after it; nothing changes where none was set."""
    before = _TIMEOUT_S
    if before is None or before >= timeout_s:
        yield
        return
    set_collective_timeout(timeout_s)
    try:
        yield
    finally:
        set_collective_timeout(before)


def _store() -> Optional[dist.Store]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is what torch raises for a collective that timed out or lost a peer."""
    if isinstance(exc, CollectiveTimeout):
        return False
    backend_error = getattr(dist, "DistBackendError", ())
    text = str(exc).lower()
    return (backend_error and isinstance(exc, backend_error)) or (
        isinstance(exc, RuntimeError) and any(word in text for word in _COLLECTIVE_FAILURES))


class RankPhases:
    """One rank's phase board: ``with phases.phase("backward", round_, step):`` marks what the rank is doing and turns
    a failed collective inside into a `CollectiveTimeout`; `gate` makes the ranks start a round together.

    Without a group of several ranks (one consumer, a colocated run) nothing is written and nothing waits."""

    def __init__(self, rank: int, world_size: int, collective_timeout_s: float, gate_timeout_s: float,
                 prefix: str = "coati-relay/phase") -> None:
        self.rank, self.world_size = rank, world_size
        self.collective_timeout_s, self.gate_timeout_s = collective_timeout_s, gate_timeout_s
        self.prefix = prefix
        self.current: Dict[str, Any] = {"phase": "set-up", "round": -1, "step": -1, "since": time.time()}

    @property
    def _board(self) -> Optional[dist.Store]:
        return _store() if self.world_size > 1 else None

    def _mark(self, phase: str, round_: int, step: int = -1) -> None:
        self.current = {"phase": phase, "round": round_, "step": step, "since": time.time()}
        store = self._board
        if store is not None:
            store.set(f"{self.prefix}/{self.rank}", json.dumps(self.current))

    def others(self) -> Dict[int, Dict[str, Any]]:
        """The last phase each other rank reported ({} where none can be read)."""
        store, seen = self._board, {}
        if store is None:
            return seen
        for r in range(self.world_size):
            if r == self.rank:
                continue
            key = f"{self.prefix}/{r}"
            try:
                if store.check([key]):
                    seen[r] = json.loads(store.get(key))
            except Exception:  # the store's host (rank 0) may be the rank that died
                log.debug("rank %d: could not read %s", self.rank, key, exc_info=True)
        return seen

    def describe_others(self) -> str:
        now, seen = time.time(), self.others()
        if not seen:
            return "the other ranks' phases could not be read (their store may have died with rank 0)"
        return "; ".join(f"rank {r} was last in phase '{p['phase']}' of round {p['round']} step {p['step']} "
                         f"({now - p['since']:.0f} s ago)" for r, p in sorted(seen.items()))

    @contextlib.contextmanager
    def phase(self, name: str, round_: int, step: int = -1) -> Iterator[None]:
        """Marks ``name`` (one of `PHASES`) as this rank's phase; a collective failure inside becomes a
        `CollectiveTimeout` naming this rank, the round, the step and the phase, and the others' last phases."""
        self._mark(name, round_, step)
        started = time.monotonic()
        try:
            yield
        except BaseException as exc:
            if not is_collective_failure(exc):
                raise
            waited = time.monotonic() - started
            raise CollectiveTimeout(
                f"consumer rank {self.rank} of {self.world_size}: a collective in phase '{name}' (round {round_}, "
                f"step {step}) failed after {waited:.0f} s ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                f"{self.describe_others()}. A rank that is stuck, dead or disagrees with the others makes this; "
                f"collectives of a step wait at most collective_timeout_s={self.collective_timeout_s:g} s (raise it "
                f"if one rank's step may legitimately take that much longer than another's)") from exc

    def gate(self, round_: int) -> None:
        """Waits until every rank reached round ``round_``'s training, at most the gate timeout; raises
        `CollectiveTimeout` naming the ranks that did not arrive."""
        store = self._board
        self._mark("gate", round_)
        if store is None:
            return
        keys = [f"{self.prefix}-gate/{round_}/{r}" for r in range(self.world_size)]
        store.set(keys[self.rank], "1")
        if round_ >= 2:  # keep the store's size flat over a long run: this rank's key of two rounds ago is read
            store.delete_key(f"{self.prefix}-gate/{round_ - 2}/{self.rank}")
        try:
            store.wait(keys, datetime.timedelta(seconds=self.gate_timeout_s))
        except Exception as exc:
            missing = _missing(store, keys)
            raise CollectiveTimeout(
                f"consumer rank {self.rank} of {self.world_size}: waited {self.gate_timeout_s:g} s (timeout_s) at "
                f"the start of round {round_} for ranks {missing} to receive their rollouts and join; "
                f"{self.describe_others()}") from exc


def _missing(store: dist.Store, keys: List[str]) -> List[int]:
    out = []
    for r, key in enumerate(keys):
        try:
            if not store.check([key]):
                out.append(r)
        except Exception:
            out.append(r)
    return out
