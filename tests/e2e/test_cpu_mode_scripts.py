"""GPU-era Ray scripts on this CPU-only host through ``coati-relay legacy-run`` (CPU mode): each script runs in a
fresh process that starts its own local Ray cluster, and CPU mode reaches every worker, user-defined actors
included."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coati_relay.toy import build_tiny_model, write_toy_dataset

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "legacy" / "four_role_ppo.py"


@pytest.fixture(scope="module")
def gpt2_path(tmp_path_factory):
    """A tiny random GPT-2 checkpoint with the toy tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-gpt2") / "model", arch="gpt2", hidden_size=64)


def legacy_run(script: Path, args, cwd: Path) -> str:
    """``coati-relay legacy-run SCRIPT ARGS`` in a fresh process; returns its combined output."""
    env = {k: v for k, v in os.environ.items() if k != "COATI_RELAY_CPU_MODE"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0",
               RAY_ADDRESS="local")  # a new local cluster, never one a crashed test left in /tmp/ray
    cli = shutil.which("coati-relay", path=os.path.dirname(sys.executable))
    proc = subprocess.run([cli, "legacy-run", str(script), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=480)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script.name} exited {proc.returncode}:\n{output[-6000:]}"
    return output


def test_four_role_example_trains_on_cpu(gpt2_path, tmp_path):
    """Four groups of two ranks each on GPU bundles; the saved actor is finite and moved from the checkpoint."""
    import torch
    from safetensors.torch import load_file

    prompts = write_toy_dataset(tmp_path / "prompts.csv", num_prompts=16, fmt="csv")
    out = legacy_run(EXAMPLE, ["--pretrain", gpt2_path, "--prompt_csv", prompts, "--workers_per_role", 2,
                               "--steps", 3, "--batch_size", 2, "--new_tokens", 8, "--lr", 1e-3,
                               "--save_dir", tmp_path / "ckpt"], tmp_path)
    assert "step 3: reward" in out and "CPU mode: the local Ray cluster declares 32 logical GPUs" in out
    assert "(PolicyWorker pid=" in out and "redirected to the CPU" in out, "the mode reaches user actors"
    start = load_file(str(gpt2_path / "model.safetensors"))
    end = torch.load(tmp_path / "ckpt" / "actor.pt", map_location="cpu")
    end = {k[len("model."):]: v for k, v in end.items() if k.startswith("model.")}
    assert set(start) <= set(end)
    assert all(torch.isfinite(v).all() for v in end.values() if v.is_floating_point())
    assert [k for k in start if not torch.equal(start[k], end[k])], "no weight moved"


PROBE = textwrap.dedent('''\
    import os
    import ray
    import torch
    import torch.distributed as dist
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


    @ray.remote(num_gpus=1)
    class Rank:
        def run(self, rank, port):
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
            dist.init_process_group("nccl")
            torch.cuda.set_device(rank)
            x = torch.full((2,), float(rank + 1)).cuda()
            dist.all_reduce(x)
            layer = torch.nn.Linear(2, 2).to(torch.cuda.current_device())
            return dist.get_backend(), x.tolist(), str(layer.weight.device)


    ray.init()
    pg = placement_group([{"GPU": 1, "CPU": 1}] * 2, strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=120)
    ranks = [Rank.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=i)).remote() for i in range(2)]
    print("RESULT", ray.get([r.run.remote(i, __PORT__) for i, r in enumerate(ranks)], timeout=120))
''')


def test_nccl_world_on_gpu_bundles_runs_on_gloo(tmp_path):
    """A two-rank NCCL world of ``num_gpus=1`` actors on a STRICT_SPREAD group of GPU bundles, on one CPU node."""
    from coati_relay.training.distributed import free_port

    script = tmp_path / "probe.py"
    script.write_text(PROBE.replace("__PORT__", str(free_port())))
    out = legacy_run(script, [], tmp_path)
    assert "RESULT [('gloo', [3.0, 3.0], 'cpu'), ('gloo', [3.0, 3.0], 'cpu')]" in out
    assert "STRICT_SPREAD placement group of 2 bundles on 1 node(s) uses SPREAD" in out
    assert out.count("CPU mode: an NCCL process group uses gloo") == 2, "once in each worker"
