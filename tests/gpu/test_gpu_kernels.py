"""After ``python -m coati_relay.training.kernels`` (the set-up step), constructing ``HybridAdam`` in a fresh process
builds nothing: each kernel it loads (``cpu_adam_x86`` or ``cpu_adam_arm``, ``fused_optim_cuda``) comes from the
cache the set-up filled. ColossalAI prints "[extension] Compiling the JIT <name> kernel" when it builds one."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from gpu_lane import MARKS

pytestmark = MARKS

_CONSTRUCT = ("import torch\n"
              "from colossalai.nn.optimizer import HybridAdam\n"
              "HybridAdam([torch.nn.Parameter(torch.zeros(8, device='cuda'))], lr=1e-3)\n"
              "print('constructed')\n")


def _python(code_or_module, timeout_s: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    args = ["-m", code_or_module] if code_or_module.startswith("coati_relay.") else ["-c", code_or_module]
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout_s)


def test_hybrid_adam_builds_nothing_after_the_kernels_module_ran():
    pytest.importorskip("colossalai")
    setup = _python("coati_relay.training.kernels", timeout_s=600)  # builds what is missing (about 90 s when all)
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
    run = _python(_CONSTRUCT, timeout_s=300)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "constructed" in out, out[-3000:]
    assert "Compiling the JIT" not in out, f"HybridAdam built a kernel the set-up had not:\n{out[-3000:]}"
