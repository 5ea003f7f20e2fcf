"""A gloo group the engine makes records no collectives in torch's flight recorder (a ring of 2,000 by default, with
their Python stacks: about 1.9 MiB it fills over a long run's first rounds), unless the environment sizes it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, pickle, sys
import torch, torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from coati_relay.training.distributed import init_process_group
from coati_relay.training.rendezvous import host_store
store = host_store(1, 30)
init_process_group(0, 1, "127.0.0.1", store.port, timeout_s=30, store=store)
t = torch.ones(3)
for _ in range(5):
    dist.all_reduce(t)
entries = pickle.loads(c10d._dump_fr_trace(True, True, False)).get("entries", [])
print(json.dumps({"entries": len(entries), "env": os.environ.get("TORCH_FR_BUFFER_SIZE")}))
dist.destroy_process_group()
"""


def _run(**env):
    base = {k: v for k, v in os.environ.items() if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**base, "OMP_NUM_THREADS": "1", **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_gloo_group_records_no_collectives_unless_the_environment_sizes_the_recorder():
    from torch._C import _distributed_c10d

    if not hasattr(_distributed_c10d, "_dump_fr_trace"):
        pytest.skip("this torch has no flight recorder dump to read")
    assert _run() == {"entries": 0, "env": "0"}
    assert _run(TORCH_FR_BUFFER_SIZE="50") == {"entries": 5, "env": "50"}, "a size given is kept"
    assert _run(TORCH_NCCL_TRACE_BUFFER_SIZE="50") == {"entries": 5, "env": None}, "so is the older name's"
