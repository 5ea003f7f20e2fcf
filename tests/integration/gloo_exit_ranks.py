"""Two spawned gloo ranks that join through the engine, all-reduce once and exit without destroying their group, as
legacy scripts and spawned test ranks do. Run as a script; its exit status is the spawn's."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from coati_relay.training.distributed import free_port, init_process_group


def _rank_main(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    init_process_group(rank, 2, "127.0.0.1", port, backend="gloo", timeout_s=60)
    total = torch.ones(8)
    dist.all_reduce(total)
    assert total.eq(2).all()


if __name__ == "__main__":
    mp.start_processes(_rank_main, args=(free_port(),), nprocs=2, start_method="spawn")
