"""The peer benchmark's sides on a GPU host (`benchmarks/peer_grpo.py`): TRL trains on the GPU (before, it ran on
the CPU whatever the host), both sides record their GPU peak (``gpu_peak_gib``, ``torch.cuda.max_memory_allocated``),
and the check of the trained weights reads a model on the GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_lane import MARKS

pytestmark = MARKS

PEER = Path(__file__).resolve().parents[2] / "benchmarks" / "peer_grpo.py"


@pytest.mark.parametrize("side", [["trl"], ["engine", "--backend", "transformers", "--colocate"]],
                         ids=["trl", "engine-colocated-transformers"])
def test_the_side_trains_on_the_gpu_and_records_its_peak(tiny_model_path, tmp_path, side):
    if side[0] == "trl":
        pytest.importorskip("trl", reason="TRL is not installed here (the device bundle brings trl 1.16)")
    out = tmp_path / "side.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(PEER), *side, "--model", tiny_model_path, "--steps", "2", "--out",
                          str(out), "--new-tokens", "4"], env=env, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    result = json.loads(out.read_text())
    assert result.get("gpu_peak_gib", 0) > 0, f"no GPU peak: the side did not train on the GPU ({result})"
    params = result["params"]
    assert params["checked"] and params["finite"] and params["moved"] > 0, params
    if side[0] == "trl":  # the model TRL trained, read where it was: every parameter on the GPU
        assert params["devices"] and all(d.startswith("cuda") for d in params["devices"]), params
    assert len(result["steps"]) == 2
