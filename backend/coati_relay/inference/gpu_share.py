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
from typing import Dict

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


def module_bytes(weights: Dict[str, torch.Tensor], dtype: torch.dtype) -> int:
    """Bytes of ``weights`` (name -> tensor) held in ``dtype``."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(t.numel() for t in weights.values()) * size
