"""A run leaves the driver's ``os.environ`` as it found it, at every entry point: ``launch_distributed`` colocated
and disaggregated, a legacy strategy, ``coati-relay compare``. A variable left behind (a rendezvous port, a
LOCAL_RANK) is inherited by every process the user starts afterwards."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_no_entry_point_leaves_anything_in_the_drivers_environment(tiny_model_path, data, tmp_path):
    from coati_relay.training.distributed import PROCESS_GROUP_ENV

    env = {k: v for k, v in os.environ.items() if k not in (*PROCESS_GROUP_ENV, "RAY_ADDRESS")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(HERE / "environ_driver.py"), tiny_model_path, str(data),
                           str(tmp_path)], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    left = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(left) == ["colocated", "compare_in_process", "disaggregated", "legacy_strategy"]
    assert left == {entry: {} for entry in left}, left
