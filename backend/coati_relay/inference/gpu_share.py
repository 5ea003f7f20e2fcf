"""A vLLM engine started on a GPU that other tensors of its process already use (a colocated trainer, the legacy
maker's four models).

vLLM reads ``gpu_memory_utilization`` as a fraction of the whole device, which must be free when the engine starts
(vLLM 0.32, ``request_memory``), and fits its weights, the activations of its profiling forward and its KV cache in
it. Its default, 0.9 of the device, fails beside a loaded model; an engine gets instead a share of what is free, less
what the process will still allocate (``reserve_bytes``: a trainer's optimizer state and gradients), rounded down to
the hundredth vLLM's fraction is written in.
"""
from __future__ import annotations

import math
from typing import Any, Dict

import torch

# Share of the memory left free (less the reserve) that an engine takes; the rest: activations of the forwards that
# run while it is awake, allocator slack.
ENGINE_SHARE_OF_FREE = 0.85
# What an engine holds beyond its weights and KV cache: the activations of its profiling forward (vLLM's
# ``max_num_batched_tokens`` tokens at once), the sampler's warm-up, cuBLAS workspaces.
ENGINE_OVERHEAD_BYTES = 2 ** 30


def engine_memory_utilization(free_bytes: int, total_bytes: int, reserve_bytes: int = 0,
                              share: float = ENGINE_SHARE_OF_FREE) -> float:
    """``gpu_memory_utilization`` for an engine given ``share`` of ``free_bytes - reserve_bytes`` on a device of
    ``total_bytes``, rounded down to a hundredth (0.0 when the reserve takes everything)."""
    if total_bytes <= 0:
        raise ValueError(f"engine_memory_utilization: total_bytes must be > 0, got {total_bytes}")
    room = max(0, free_bytes - reserve_bytes)
    return math.floor(100 * share * room / total_bytes) / 100


def engine_need_bytes(weight_bytes: int, kv_cache_bytes: int) -> int:
    """The least an engine needs: its weights, a KV cache of ``kv_cache_bytes`` and `ENGINE_OVERHEAD_BYTES`."""
    return weight_bytes + kv_cache_bytes + ENGINE_OVERHEAD_BYTES


class NoRoomForEngine(RuntimeError):
    """The memory free on the device (less the reserve) is too little for a vLLM engine; the message says how much
    it needs and how much there is."""


def shared_gpu_engine_kwargs(dtype: torch.dtype, weight_bytes: int, kv_cache_bytes: int, free_bytes: int,
                             total_bytes: int, reserve_bytes: int = 0,
                             share: float = ENGINE_SHARE_OF_FREE) -> Dict[str, Any]:
    """vLLM keywords for an engine in ``dtype`` beside other tensors of its process: ``dtype`` and the
    ``gpu_memory_utilization`` of `engine_memory_utilization`. Raises `NoRoomForEngine` when that share is less
    than `engine_need_bytes` (``weight_bytes`` of weights in ``dtype``, at least ``kv_cache_bytes`` of KV cache)."""
    utilization = engine_memory_utilization(free_bytes, total_bytes, reserve_bytes, share)
    need = engine_need_bytes(weight_bytes, kv_cache_bytes)
    if utilization * total_bytes < need:
        kept = f", {reserve_bytes / 2**30:.1f} GiB of it kept for training" if reserve_bytes else ""
        raise NoRoomForEngine(f"a vLLM engine in {dtype} needs about {need / 2**30:.1f} GiB (weights "
                              f"{weight_bytes / 2**30:.1f} GiB, KV cache {kv_cache_bytes / 2**30:.2f} GiB, "
                              f"{ENGINE_OVERHEAD_BYTES / 2**30:.0f} GiB of working memory) and {share:.0%} of the "
                              f"{free_bytes / 2**30:.1f} of {total_bytes / 2**30:.1f} GiB free{kept} is "
                              f"{utilization * total_bytes / 2**30:.1f} GiB")
    return {"dtype": str(dtype).removeprefix("torch."), "gpu_memory_utilization": utilization}


def parameter_bytes(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """Bytes of ``module``'s parameters (tied ones once) held in ``dtype``."""
    return sum(p.numel() for p in module.parameters()) * torch.empty((), dtype=dtype).element_size()
