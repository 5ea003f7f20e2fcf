"""Closing a producer's in-process vLLM engine leaves the process's default process group alone: a colocated run's
trainers keep their group after the engine shuts down, and a second run in the same process can use it. (vLLM's
`destroy_distributed_environment` destroys the default group; only its multiprocess executor's workers call it, in
their own processes.) Run in a fresh process, so that no other test sees its group."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import os, socket, sys
    import torch
    import torch.distributed as dist
    from coati_relay.config.schema import SamplingConfig
    from coati_relay.inference import VLLMBackend

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    group = dist.group.WORLD
    backend = VLLMBackend(sys.argv[1], SamplingConfig(max_new_tokens=4), seed=0, max_rows=4, max_prompt_tokens=8,
                          enforce_eager=True)
    backend.generate([[3, 4, 5]], 2)
    backend.close()
    assert dist.is_initialized(), "the default process group is gone after close()"
    assert dist.group.WORLD is group, "the default process group was replaced"
    total = torch.ones(3)
    dist.all_reduce(total)
    print("group after close:", dist.get_world_size(), total.tolist())
""")


def test_closing_the_engine_keeps_the_default_process_group(tiny_model_path):
    pytest.importorskip("vllm")
    done = subprocess.run([sys.executable, "-c", SCRIPT, tiny_model_path], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "group after close: 1 [1.0, 1.0, 1.0]" in done.stdout
