"""Rendezvous stores that cannot lose their port to a race.

A port picked free, released, and bound later by the group's store can be taken in between by any socket on the
host (another group's store or gloo pairs, a client connection): the group then fails with EADDRINUSE. So here the
store binds first and the port is told afterwards:

- `host_store`: rank 0's store listens on a port the OS picks (``port=0``) from the moment it exists; the caller
  sends ``store.port`` to the other ranks, which `join_store` it. The engine's groups form this way.
- `given_port_store`: for a port chosen beforehand (a legacy ``env_info``'s ``master_port``): rank 0 binds it, or a
  fresh port when it was taken since, and posts the port it bound on a `RayPortBoard`, where the other ranks read
  it. The legacy strategies form their groups this way inside Ray.
"""
from __future__ import annotations

import datetime
import logging
import time

import torch.distributed as dist

logger = logging.getLogger(__name__)

_POLL_S = 0.05


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

    def read(self, key: str, timeout_s: float) -> int:
        """The port posted under ``key``; waits for the post at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self._kv._internal_kv_get(key, namespace=self._namespace)
            if value is not None:
                return int(value)
            if time.monotonic() > deadline:
                raise TimeoutError(f"rendezvous: rank 0 posted no port for {key} within {timeout_s:.0f}s; is rank 0 "
                                   "of this group running, with the same master_addr, master_port and world_size?")
            time.sleep(_POLL_S)


def given_port_store(rank: int, world_size: int, host: str, port: int, timeout_s: float,
                     board) -> dist.TCPStore:
    """The store of a group whose ``host:port`` was chosen beforehand. Rank 0 binds ``port``, or a port the OS picks
    when ``port`` was taken since it was chosen (logged), posts the bound port on ``board`` (`RayPortBoard`'s
    methods) and removes the post once every rank has joined; the other ranks read the port there and join.
    Every wait is bounded by ``timeout_s``."""
    key = f"{host}:{port}/{world_size}"
    if rank != 0:
        store = join_store(host, board.read(key, timeout_s), world_size, timeout_s)
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
        store.wait([f"coati-relay/joined/{r}" for r in range(1, world_size)], _timeout(timeout_s))
    finally:
        board.remove(key)
    return store
