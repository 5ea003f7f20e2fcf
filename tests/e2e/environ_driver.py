"""A fresh driver that runs each entry point in turn and prints, as one JSON line, what each one left changed in
``os.environ`` ({entry: {variable: [before, after]}}). Arguments: MODEL_DIR DATA_FILE WORK_DIR.

The process group an entry point made is destroyed after it, so that the next entry point makes its own."""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import torch.distributed as dist
from run_helpers import run_kwargs

MODEL, DATA, WORK = sys.argv[1], sys.argv[2], Path(sys.argv[3])
REPO = Path(__file__).resolve().parents[2]


def colocated() -> None:
    from coati_relay import launch_distributed

    launch_distributed(**run_kwargs(MODEL, DATA, WORK / "colocated", backend="transformers", rounds=1,
                                    num_producers=1, num_consumer_procs=1, colocate=True))


def disaggregated() -> None:
    from coati_relay import launch_distributed

    launch_distributed(**run_kwargs(MODEL, DATA, WORK / "disaggregated", backend="transformers", rounds=1))


def legacy_strategy() -> None:
    """A legacy script's strategy in the driver (Ray is up), on the rendezvous variables the script set (no
    LOCAL_RANK) naming a port that was taken since it was chosen (the group moves to another)."""
    import socket

    from coati_compat.legacy.strategies import DDPStrategy

    taken = socket.socket()
    taken.bind(("", 0))
    taken.listen()
    script_env = dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(taken.getsockname()[1]))
    os.environ.update(script_env)
    try:
        DDPStrategy()
    finally:
        taken.close()
    changed = {k: os.environ.get(k) for k in (*script_env, "LOCAL_RANK") if os.environ.get(k) != script_env.get(k)}
    assert not changed, f"the strategy changed the script's environment: {changed}"
    for key in script_env:
        del os.environ[key]  # the script's own


def compare_in_process() -> None:
    """`coati-relay compare` with its sides' processes stubbed: what runs in the calling process."""
    from coati_compat.compare import cli, sides

    def no_process(command, env, cwd, log_path, steps_made, budget, timeout_s):
        return sides.SideRun(command=command, returncode=1, wall_s=0.0, stopped_at=None, timed_out=False,
                             log=str(log_path), peak_memory_mib={}, total_peak_memory_mib=0.0)

    sides.run_side = no_process
    cli.compare(cli.parse([str(REPO / "examples/legacy/ppo_many_roles.py"), "--steps", "2", "--legacy-runs", "1",
                           "--out", str(WORK / "compare"), "--"]))


def main() -> None:
    warnings.simplefilter("ignore")
    left = {}
    for entry in (colocated, disaggregated, legacy_strategy, compare_in_process):
        before = dict(os.environ)
        entry()
        left[entry.__name__] = {k: [before.get(k), os.environ.get(k)] for k in set(before) | set(os.environ)
                                if before.get(k) != os.environ.get(k)}
        if dist.is_initialized():
            dist.destroy_process_group()
    print(json.dumps(left))


if __name__ == "__main__":
    main()
