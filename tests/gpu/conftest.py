"""Fixtures of the GPU lane: a Ray cluster whose GPUs the roles can use, and the tiny model on disk."""
from __future__ import annotations

import gc
import os

import pytest
import torch


@pytest.fixture(scope="session")
def gpu_ray_cluster():
    """The session's Ray cluster. Started here when none runs: with one CUDA device, it declares two logical GPUs
    and leaves CUDA_VISIBLE_DEVICES alone, so that a producer and a consumer (one GPU each in the placement group)
    share the device, each process taking only what it needs (vLLM its gpu_memory_utilization)."""
    import ray

    started = False
    if not ray.is_initialized():
        devices = torch.cuda.device_count()
        if devices == 1:
            os.environ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
        ray.init(address="local", num_cpus=8, num_gpus=max(2, devices), include_dashboard=False,
                 namespace="coati-relay-gpu-tests", log_to_driver=False, configure_logging=False)
        started = True
    yield ray
    if started:
        gc.collect()
        ray.shutdown()


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """The toy task's prompts: 8 of them, in a JSONL file."""
    from coati_relay.toy import write_toy_dataset

    return write_toy_dataset(tmp_path_factory.mktemp("gpu") / "toy.jsonl", num_prompts=8)
