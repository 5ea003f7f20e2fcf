"""A gloo group joined through the engine never aborts its process at exit.

Left to the interpreter's teardown, torch's gloo group sometimes aborts a rank ("terminate called without an active
exception", SIGABRT): 6 of 60 two-rank runs on this project's 2-core hosts. The engine destroys it at exit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = 16  # at the abort rate seen without the fix (about 1 in 10), 16 runs miss it about 2 times in 10
SCRIPT = Path(__file__).with_name("gloo_exit_ranks.py")


@pytest.mark.slow
def test_spawned_gloo_ranks_exit_without_an_abort():
    failures = []
    for run in range(RUNS):
        done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0 or "terminate called" in done.stderr:
            failures.append(f"run {run}: exit {done.returncode}: {done.stderr.strip().splitlines()[-3:]}")
    assert not failures, f"{len(failures)} of {RUNS} runs aborted or failed: {failures}"
