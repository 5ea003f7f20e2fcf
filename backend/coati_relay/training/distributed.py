"""The torch.distributed process group that the consumers of one data-parallel group share.

Each consumer is its own process (a Ray actor in the engine) and calls `init_process_group` once with its rank;
gradients are then all-reduced over gloo (CPU) or NCCL (CUDA). This does what ``colossalai.launch`` does (process
group, device of the local rank), except seeding, and adds a timeout to the rendezvous, which
``colossalai.launch`` cannot take.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
import socket
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from coati_relay.training.rendezvous import RayPortBoard, given_port_store, host_store

logger = logging.getLogger(__name__)

_BACKENDS = ("gloo", "nccl")


def free_port() -> int:
    """A TCP port that is free on this host right now (the OS picks it), for a caller that must name a port before
    any store binds it (a legacy ``env_info``). Anything may take it before then: a group of this package hosts its
    store on a port of its own instead (`coati_relay.training.rendezvous`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _accelerator_backend() -> str:
    try:
        from colossalai.accelerator import get_accelerator
    except ImportError:
        return "nccl" if torch.cuda.is_available() else "gloo"
    return get_accelerator().communication_backend


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int,
                       backend: Optional[str] = None, timeout_s: float = 300,
                       store: Optional[dist.Store] = None) -> None:
    """Joins (or, for rank 0, creates) the default process group; a no-op when this process is already in it.

    backend: "gloo" or "nccl"; None picks the accelerator's (gloo on CPU, NCCL on CUDA).
    timeout_s: bound on the rendezvous and on every later collective.
    store: the group's rendezvous store (`rendezvous.host_store` on rank 0, `rendezvous.join_store` on the others),
        whose port ``master_port`` names; None: rank 0 binds ``master_port`` itself (it must still be free).
    """
    for key, value in (("rank", rank), ("world_size", world_size), ("master_port", master_port)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"init_process_group: {key} must be an int, got {type(value).__name__}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"init_process_group: need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if not 0 < master_port < 65536:
        raise ValueError(f"init_process_group: master_port must be in 1..65535, got {master_port}")
    if not isinstance(master_addr, str) or not master_addr:
        raise ValueError(f"init_process_group: master_addr must be a host name or address, got {master_addr!r}")
    if timeout_s <= 0:
        raise ValueError(f"init_process_group: timeout_s must be > 0, got {timeout_s}")
    backend = backend or _accelerator_backend()
    if backend not in _BACKENDS:
        raise ValueError(f"init_process_group: backend must be one of {_BACKENDS} or None, got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("init_process_group: backend 'nccl' needs CUDA; use 'gloo' (or None) on this host")

    if dist.is_initialized():
        if dist.get_rank() != rank or dist.get_world_size() != world_size:
            raise RuntimeError(f"init_process_group: this process is already rank {dist.get_rank()} of "
                               f"{dist.get_world_size()}, cannot become rank {rank} of {world_size}")
        return

    local_rank = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
    # colossalai's DistCoordinator reads these.
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR=master_addr,
                      MASTER_PORT=str(master_port))
    host = f"[{master_addr}]" if ":" in master_addr else master_addr
    logger.info("joining process group tcp://%s:%d as rank %d of %d (%s)", host, master_port, rank, world_size,
                backend)
    where = {"store": store} if store is not None else {"init_method": f"tcp://{host}:{master_port}"}
    _no_flight_recorder_on_gloo(backend)
    dist.init_process_group(backend=backend, **where, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    _leave_group_at_exit(world_size)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)


# torch's flight recorder keeps a process group's last TORCH_FR_BUFFER_SIZE collectives (2,000 by default) with their
# Python stacks, for the dumps of NCCL's watchdog: about 1.9 MiB a gloo group fills by its 2,000th collective, which a
# long run's soak reads as growth per round for its first few hundred rounds (DDP runs several collectives a round;
# `benchmarks/memory_soak.py`). A gloo group records none unless either variable is set.
FLIGHT_RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def _no_flight_recorder_on_gloo(backend: str) -> None:
    """``TORCH_FR_BUFFER_SIZE=0`` for a gloo group about to be made (torch reads it then), unless the flight
    recorder's size is set in the environment."""
    if backend == "gloo" and not any(key in os.environ for key in FLIGHT_RECORDER_ENV):
        os.environ[FLIGHT_RECORDER_ENV[0]] = "0"


def _leave_group_at_exit(world_size: int) -> None:
    """Destroys a default gloo group of several ranks when the interpreter exits normally, before its teardown
    (registered once). A group of one, the driver's, is left as before: the test suite's process, which holds one
    beside in-process engines and Ray, ended once in a segmentation fault after its last test with the hook applied
    to it too (not traced further).

    A gloo group left to the interpreter's teardown sometimes aborts the process ("terminate called without an active
    exception", SIGABRT): 4 of 30 two-rank runs of an all-reduce that exited without destroying the group, 0 of 30
    with it destroyed first. Legacy scripts and spawned ranks exit without destroying theirs."""
    global _EXIT_HOOK
    if world_size > 1 and not _EXIT_HOOK:
        atexit.register(_destroy_gloo_group)
        _EXIT_HOOK = True


def _destroy_gloo_group() -> None:
    if dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()


_EXIT_HOOK = False


def _in_ray() -> bool:
    """Whether this process is connected to Ray (an actor, or a driver that called ``ray.init``)."""
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def init_process_group_from_env(timeout_s: float = 300, required: bool = True, advice: Optional[str] = None) -> bool:
    """Joins the default process group that `RENDEZVOUS_ENV` describes (a no-op when this process is in one); returns
    whether this process is in a group now.

    Inside Ray the group meets on MASTER_PORT or, when that port was taken since it was chosen, on one its rank 0
    binds and tells the others through Ray (`rendezvous.given_port_store`), and the environment stays as it was.
    Elsewhere through the launcher's ``env://`` rendezvous: torchrun (whose agent already hosts the store on
    MASTER_PORT) or a script that spawns its ranks; gloo on CPU, NCCL on CUDA (on the device of LOCAL_RANK).

    timeout_s: bound on the rendezvous and on every later collective.
    required: False: where the environment describes no group, stay without one instead of raising.
    advice: what the error for unset variables tells the caller to do (default: how a launcher sets them).
    """
    if dist.is_initialized():
        return True
    missing = [key for key in RENDEZVOUS_ENV if key not in os.environ]
    if missing and not required:
        return False
    if missing:
        advice = advice or f"a launcher (torchrun) sets {list(RENDEZVOUS_ENV)}, or call init_process_group with them"
        raise ValueError(f"init_process_group_from_env: the environment variables {missing} are not set; {advice}")
    if timeout_s <= 0:
        raise ValueError(f"init_process_group_from_env: timeout_s must be > 0, got {timeout_s}")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if _in_ray():
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        store = given_port_store(rank, world_size, addr, port, timeout_s, RayPortBoard())
        with process_group_env_kept():
            init_process_group(rank, world_size, addr, store.port, timeout_s=timeout_s, store=store)
        return True
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    _no_flight_recorder_on_gloo(backend)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    _leave_group_at_exit(world_size)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return True


# The variables of a torch.distributed env:// rendezvous (``LOCAL_RANK`` aside: a launcher's, not the rendezvous').
RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Every variable `init_process_group` sets.
PROCESS_GROUP_ENV = (*RENDEZVOUS_ENV, "LOCAL_RANK", FLIGHT_RECORDER_ENV[0])


def ensure_single_process_group(timeout_s: float = 60) -> None:
    """A process group of one on localhost when none exists (DDP and the plugins need one).

    The group is this process's own (a driver training in place, a test): the variables of `PROCESS_GROUP_ENV` are
    left as they were, so that a process it starts later does not inherit a rendezvous on the port this one holds
    (a legacy strategy there would try to listen on it) or a LOCAL_RANK (it would take itself for a rank of it)."""
    if dist.is_initialized():
        return
    with process_group_env_kept():
        store = host_store(1, timeout_s)
        init_process_group(0, 1, "127.0.0.1", store.port, timeout_s=timeout_s, store=store)


@contextlib.contextmanager
def process_group_env_kept() -> Iterator[None]:
    """The variables of `PROCESS_GROUP_ENV` as they were before the block (set, changed or removed in it)."""
    saved = {key: os.environ.get(key) for key in PROCESS_GROUP_ENV}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def barrier(timeout_s: float = 300) -> None:
    """Waits for every rank, at most ``timeout_s`` on gloo; a no-op without a process group of more than one."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    if dist.get_backend() == "gloo":
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
    else:  # NCCL's barrier is bounded by the group's timeout: ``timeout_s`` for this one
        from coati_relay.training.rank_phases import longer_timeout

        with longer_timeout(timeout_s):
            dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over every rank of the default group; itself where there is no group of more than one.

    A collective: every rank calls it with a tensor of the same shape and dtype (on the CUDA device under NCCL).
    It is bounded by the process group's timeout.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tensor
    out = tensor.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_min(value: int) -> int:
    """The smallest ``value`` over every rank of the default group (a collective, like `all_reduce_sum`)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    from coati_relay.cluster.devices import accelerator_device

    out = torch.tensor([value], dtype=torch.int64,
                       device=accelerator_device() if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(out, op=dist.ReduceOp.MIN)
    return int(out.item())
