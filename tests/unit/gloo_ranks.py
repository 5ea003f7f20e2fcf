"""Spawns the ranks of a local gloo group for a test and waits for them, with a deadline."""
from __future__ import annotations

import time


def run_ranks(rank_main, args: tuple, world: int, timeout_s: float) -> None:
    """Runs ``rank_main(rank, port, *args)`` in ``world`` spawned processes; ``port`` is a free TCP port for the
    group's rendezvous. Raises ``TimeoutError`` when the ranks have not all finished within ``timeout_s``, and the
    spawn error of a rank that failed; kills what still runs on the way out."""
    import torch.multiprocessing as mp

    from coati_relay.training.distributed import free_port

    ctx = mp.start_processes(rank_main, args=(free_port(), *args), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world} ranks did not finish within {timeout_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
