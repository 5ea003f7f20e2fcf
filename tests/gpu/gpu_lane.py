"""Marks and helpers of the GPU lane (``make test-gpu``): every test in this folder needs CUDA and skips without it,
saying why (skipped, never passed); the vLLM tests also skip where vLLM cannot be imported, and the multi-rank ones
where the host has fewer GPUs than ranks."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

CUDA = torch.cuda.is_available()
DEVICES = torch.cuda.device_count() if CUDA else 0

MARKS = [pytest.mark.gpu, pytest.mark.slow,
         pytest.mark.skipif(not CUDA, reason="needs CUDA: the GPU lane runs on a CUDA host "
                                              "(docs/contributing.md, 'GPU test lane')")]


def needs_devices(n: int):
    """Skips unless the host has ``n`` CUDA devices (NCCL ranks need a device each)."""
    return pytest.mark.skipif(DEVICES < n, reason=f"needs {n} CUDA devices (one per NCCL rank); this host has "
                                                  f"{DEVICES}")


def run_ranks(script: Path, world: int, args: List[str], timeout_s: float = 600) -> List[str]:
    """Runs ``python script RANK WORLD *args`` once per rank, each its own process; returns their outputs and
    fails the test, with the tail of every output, when a rank fails or outlives ``timeout_s``."""
    env: Dict[str, str] = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(world), *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(world)]
    try:
        outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    if any(p.returncode for p in procs):
        pytest.fail("a rank failed:\n" + "\n---\n".join(o[-4000:] for o in outputs))
    return outputs


def changed_fraction(before: Dict[str, torch.Tensor], after: Dict[str, torch.Tensor]) -> float:
    """The fraction of ``before``'s tensors whose values differ in ``after`` (compared in float32 on the CPU)."""
    keys = [k for k in before if k in after]
    assert keys, f"no common weight names: {sorted(before)[:3]} vs {sorted(after)[:3]}"
    moved = sum(not torch.equal(before[k].float().cpu(), after[k].float().cpu()) for k in keys)
    return moved / len(keys)


def non_finite(state: Dict[str, torch.Tensor]) -> List[str]:
    """Names of the tensors of ``state`` holding inf or NaN."""
    return [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]


def needs_vllm():
    """Skips the calling test where vLLM cannot be imported (its CUDA wheel is not on every GPU host)."""
    return pytest.importorskip("vllm", reason="vLLM is not importable here: make setup-gpu installs its CUDA build; "
                                              "an offline host without it skips the vLLM tests")


def rose(history, key: str = "reward") -> Tuple[float, float]:
    """(mean of the first quarter, mean of the last quarter) of ``key`` over a run's history."""
    r = [h[key] for h in history]
    k = max(2, len(r) // 4)
    return sum(r[:k]) / k, sum(r[-k:]) / k


def needs_cluster_gpus(ray, n: int) -> None:
    """Skips the test unless the Ray cluster has ``n`` GPUs (one per role of the run)."""
    have = int(ray.cluster_resources().get("GPU", 0))
    if have < n:
        pytest.skip(f"the run's roles need {n} GPUs and this session's Ray cluster has {have}; run the GPU lane "
                    f"alone (make test-gpu), whose own cluster lets the roles share one device")


def run_kwargs(model: str, data: str, run_dir: Path, algo: str, backend: str, **over):
    """`launch_distributed` keywords of a short toy run on CUDA: one producer and one consumer (a GPU each),
    LowLevelZero in bf16, 4 prompts x 4 responses a round, 2 rounds (``num_episodes`` more: 2 rounds each)."""
    engine = {"vllm": {"gpu_memory_utilization": 0.3, "enforce_eager": True}, "transformers": {}}[backend]
    kw = dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
        inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
        train_dataset_config={"path": str(data), "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": model, **engine}, train_model_config={"path": model},
        generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0}, seed=0,
        grpo_config={"lr": 1e-3, "critic_lr": 1e-3, "reward_fn_type": "toy_letter"},
        plugin_config={"plugin": "zero2"}, inference_backend=backend, num_generations=4, core_algo=algo,
        run_dir=str(run_dir), save_interval=1000, progress=False, timeout_s=300,
    )
    kw.update(over)
    return kw


def trained_weights(checkpoint: str, backend: str = "policy") -> Dict[str, torch.Tensor]:
    """The weights a run's checkpoint holds for one of its training backends (policy, critic)."""
    return torch.load(Path(checkpoint) / backend / "model.pt", map_location="cpu")
