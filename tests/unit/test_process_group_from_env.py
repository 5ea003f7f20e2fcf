"""`init_process_group_from_env`: the launcher's env:// rendezvous (torchrun, spawned ranks), in a process apart."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from coati_relay.training.distributed import free_port

REPO = Path(__file__).resolve().parents[2]

CODE = textwrap.dedent("""
    import json, os
    import torch.distributed as dist
    from coati_relay.training.distributed import init_process_group_from_env

    try:
        init_process_group_from_env(timeout_s=30)
    except ValueError as e:
        missing = str(e)
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    init_process_group_from_env(timeout_s=30)
    init_process_group_from_env(timeout_s=30)  # already in a group: nothing to do
    print(json.dumps({"missing": missing, "world": dist.get_world_size(), "backend": dist.get_backend()}))
""")


def test_joins_the_launchers_group_and_names_missing_variables():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PORT=str(free_port()), PYTHONPATH=os.pathsep.join([str(REPO / "backend"), str(REPO / "compat")]))
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["world"] == 1 and out["backend"] == "gloo"
    assert "['RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'] are not set" in out["missing"]
