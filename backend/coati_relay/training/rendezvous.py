"""Rendezvous stores that cannot lose their port to a race.

A port picked free, released, and bound later by the group's store can be taken in between by any socket on the
host (another group's store or gloo pairs, a client connection): the group then fails with EADDRINUSE. So here the
store binds first and the port is told afterwards:

- `host_store`: rank 0's store listens on a port the OS picks (``port=0``) from the moment it exists; the caller
  sends ``store.port`` to the other ranks, which `join_store` it. The engine's groups form this way.
- `given_port_store`: for a port chosen beforehand (a legacy ``env_info``'s ``master_port``): rank 0 binds it, or a
  fresh port when it was taken since, and posts the port it bound on a `RayPortBoard`, where the other ranks read
  it. The legacy strategies form their groups this way inside Ray. A rank announces itself on the board
  (`announce_member`) as soon as it knows its place, before anything that may fail; the ranks waiting for it then
  notice its death within a second instead of waiting for the whole timeout.
"""
from __future__ import annotations

import datetime
import logging
import re
import time
from typing import Any, Dict, Iterable, Optional

import torch.distributed as dist

from coati_relay.cluster.liveness import LivenessProbe

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_LIVENESS_POLL_S = 0.5  # how often a waiting rank looks whether the ranks it waits for have died


def _timeout(timeout_s: float) -> datetime.timedelta:
    if timeout_s <= 0:
        raise ValueError(f"rendezvous: timeout_s must be > 0, got {timeout_s}")
    return datetime.timedelta(seconds=timeout_s)


def host_store(world_size: int, timeout_s: float, port: int = 0) -> dist.TCPStore:
    """Rank 0's store of a group of ``world_size``, listening on ``port`` (0: a free port the OS picks; read
    ``.port``) on every interface of this host from the moment it returns. Raises ``DistNetworkError`` (EADDRINUSE)
    when ``port`` is taken."""
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=True, timeout=_timeout(timeout_s),
                         wait_for_workers=False)


def host_store_on(port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """`host_store` on ``port`` (a ``master_port`` given to the run); when another process holds it, on a port the
    OS picks, with a warning that names both."""
    try:
        return host_store(world_size, timeout_s, port)
    except (dist.DistNetworkError, OSError) as exc:
        if not is_address_in_use(exc):
            raise
    store = host_store(world_size, timeout_s)
    logger.warning("rendezvous: master_port %d is taken on this node; the consumers' group meets on port %d "
                   "instead", port, store.port)
    return store


def join_store(host: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """The store rank 0 hosts on ``host:port``, as another rank: retries the connection until ``timeout_s``."""
    if not 0 < port < 65536:
        raise ValueError(f"join_store: port must be in 1..65535 (the one rank 0's store bound), got {port}")
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=_timeout(timeout_s))


def is_address_in_use(exc: BaseException) -> bool:
    """Whether ``exc`` says a port to listen on was taken (EADDRINUSE)."""
    return isinstance(exc, (dist.DistNetworkError, OSError)) and (
        "EADDRINUSE" in str(exc) or "ddress already in use" in str(exc))


class RayPortBoard:
    """Where rank 0 posts the port its store bound, per group, for the other ranks of the same Ray job to read (Ray's
    internal key-value store, as ``ray.util.collective`` uses for its rendezvous). A post lasts until the group met
    (`given_port_store` removes it), so a later group on the same address and port reads its own."""

    def __init__(self) -> None:
        import ray
        from ray.experimental import internal_kv

        if not ray.is_initialized():
            raise RuntimeError("RayPortBoard needs Ray: call ray.init() first, or form the group without Ray")
        self._kv = internal_kv
        self._namespace = f"coati-relay-rendezvous-{ray.get_runtime_context().get_job_id()}"

    def post(self, key: str, port: int) -> None:
        self._kv._internal_kv_put(key, str(port), overwrite=True, namespace=self._namespace)

    def remove(self, key: str) -> None:
        self._kv._internal_kv_del(key, namespace=self._namespace)

    def announce(self, key: str, rank: int) -> None:
        """Posts this Ray actor as ``rank`` of the group ``key``, for the ranks that wait for it to watch."""
        import ray

        handle = ray.get_runtime_context().current_actor
        self._kv._internal_kv_put(f"{key}/member/{rank}", ray.cloudpickle.dumps(handle), overwrite=True,
                                  namespace=self._namespace)

    def members(self, key: str, ranks: Iterable[int]) -> Dict[int, Any]:
        """The Ray actor handles announced for ``ranks`` of the group ``key`` so far."""
        import ray

        found = {r: self._kv._internal_kv_get(f"{key}/member/{r}", namespace=self._namespace) for r in ranks}
        return {r: ray.cloudpickle.loads(v) for r, v in found.items() if v is not None}

    def forget_members(self, key: str, world_size: int) -> None:
        for r in range(world_size):
            self._kv._internal_kv_del(f"{key}/member/{r}", namespace=self._namespace)

    def read(self, key: str, timeout_s: float, check=None) -> int:
        """The port posted under ``key``; waits for the post at most ``timeout_s``; ``check()`` runs while it
        waits and may raise to end the wait."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self._kv._internal_kv_get(key, namespace=self._namespace)
            if value is not None:
                return int(value)
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"rendezvous: rank 0 posted no port for {key} within {timeout_s:.0f}s; is rank 0 "
                                   "of this group running, with the same master_addr, master_port and world_size?")
            time.sleep(_POLL_S)


def group_key(host: str, port: int, world_size: int) -> str:
    """The name of the group meeting on ``host:port`` with ``world_size`` ranks, on a `RayPortBoard`."""
    return f"{host}:{port}/{world_size}"


def announce_member(host: str, port: int, world_size: int, rank: int) -> None:
    """Inside a Ray actor: posts it as ``rank`` of the group that will meet on ``host:port`` (`given_port_store`),
    so that the ranks waiting for it notice if it dies before it joins. Elsewhere: nothing."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return
    RayPortBoard().announce(group_key(host, port, world_size), rank)


class MemberWatch:
    """Raises, from `check`, once a Ray actor announced (`announce_member`) as one of ``ranks`` of ``key`` has
    died; looks at most every `_LIVENESS_POLL_S` seconds."""

    def __init__(self, board, key: str, ranks: Iterable[int]) -> None:
        self.board, self.key, self.ranks = board, key, list(ranks)
        self.probe = LivenessProbe({})
        self._next = 0.0

    def check(self, waiting_for: Optional[Iterable[int]] = None) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + _LIVENESS_POLL_S
        for rank, handle in self.board.members(self.key, self.ranks).items():
            if str(rank) not in self.probe.names():
                self.probe.add(str(rank), handle)
        waiting = {str(r) for r in (self.ranks if waiting_for is None else waiting_for)}
        dead = sorted(self.probe.dead() & waiting, key=int)
        if dead:
            causes = "; ".join(f"rank {r}: {_last_error_line(self.probe.causes[r])}" for r in dead)
            raise RuntimeError(f"rendezvous of the group on {self.key}: rank(s) {', '.join(dead)} died before joining "
                               f"({causes}); fix what ended it (its own error is in its actor's log) and start the "
                               "group again")


def _last_error_line(exc: BaseException) -> str:
    """The line of a Ray error that says what ended the actor (its own exception, or how it was killed)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b.*:", line)]
    return (errors or lines or [type(exc).__name__])[-1][:300]


def given_port_store(rank: int, world_size: int, host: str, port: int, timeout_s: float,
                     board) -> dist.TCPStore:
    """The store of a group whose ``host:port`` was chosen beforehand. Rank 0 binds ``port``, or a port the OS picks
    when ``port`` was taken since it was chosen (logged), posts the bound port on ``board`` (`RayPortBoard`'s
    methods) and removes the post once every rank has joined; the other ranks read the port there and join.
    Every wait is bounded by ``timeout_s``, and ends early with an error naming a rank that announced itself
    (`announce_member`) and died before joining."""
    key = group_key(host, port, world_size)
    if rank != 0:
        watch = MemberWatch(board, key, [0])
        store = join_store(host, board.read(key, timeout_s, check=watch.check), world_size, timeout_s)
        store.set(f"coati-relay/joined/{rank}", "1")
        return store
    try:
        store = host_store(world_size, timeout_s, port)
    except dist.DistNetworkError as exc:
        if not is_address_in_use(exc):
            raise
        store = host_store(world_size, timeout_s)
        logger.warning("rendezvous: port %d (chosen for the group on %s) was taken since it was chosen; the group "
                       "meets on port %d instead", port, host, store.port)
    board.post(key, store.port)
    try:
        _wait_for_ranks(store, MemberWatch(board, key, range(1, world_size)), world_size, timeout_s)
    finally:
        board.remove(key)
        board.forget_members(key, world_size)
    return store


def _wait_for_ranks(store: dist.TCPStore, watch: MemberWatch, world_size: int, timeout_s: float) -> None:
    joined = {r: f"coati-relay/joined/{r}" for r in range(1, world_size)}
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r, k in joined.items() if not store.check([k])]
        if not missing:
            return
        watch.check(missing)
        if time.monotonic() > deadline:
            raise TimeoutError(f"rendezvous of the group on {watch.key}: rank(s) {missing} did not join within "
                               f"{timeout_s:.0f}s; are they running, with the same master_addr, master_port and "
                               "world_size?")
        time.sleep(_POLL_S)
