"""Device memory a training backend takes at its first backward and optimizer step, beyond what its set-up holds.

Set-up puts the weights on the device (and, where the plugin makes them there: ZeRO's float32 master shard, Gemini's
chunks, DDP's gradient buckets), but Adam's two moments are made by the first ``step`` and the gradients by the first
``backward``. A vLLM engine sized from the memory free after set-up (a colocated run) must leave room for them, or
waking it after step 1 runs out of memory: a 1.5B model under float32 DDP on 80 GB gave the engine about 60 GB, then
about 27 GB stayed in use after the first step.

`step_state_bytes` counts, per trained parameter, in the plugin's own precision and sharding:
- Adam's moments: two float32 values (torch's AdamW keeps them in the master weights' dtype, float32 here; HybridAdam
  too), divided over the ranks under ZeRO (``zero2``, ``gemini``, ``hybrid`` with ``zero_stage`` >= 1), none on the
  device where the optimizer state lives on the CPU (``cpu_offload``; Gemini's ``offload_optim_frac`` moves that
  share);
- the gradients: in the compute dtype (float32 for ``ddp``), divided over the ranks where stage 2 partitions them;
  Gemini writes them into its low-precision chunks (none extra) unless ``enable_gradient_accumulation`` gives them
  chunks of their own, and DDP with ``gradient_as_bucket_view`` into its buckets (made at set-up);
- under mixed precision, the float32 gradients of the master shard that the optimizer step reads (on the device
  unless the optimizer state is on the CPU).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable

import torch

from coati_relay.training.plugins import PLUGINS, precision_dtype

FLOAT32_BYTES = 4
ADAM_MOMENTS = 2


def _zero_stage(plugin: str, options: Dict[str, Any]) -> int:
    if plugin == "zero2":
        return int(options.get("stage", 2))
    if plugin == "hybrid":
        return int(options.get("zero_stage", 0))
    return 3 if plugin == "gemini" else 0


def _optimizer_share_on_device(plugin: str, options: Dict[str, Any]) -> float:
    """The share of the optimizer state (moments, master gradients) that lives on the device."""
    if options.get("cpu_offload"):
        return 0.0
    if plugin == "gemini":
        return 1.0 - float(options.get("offload_optim_frac", 0.0))
    return 1.0


def step_state_bytes(num_params: int, plugin: str, options: Dict[str, Any], world_size: int = 1) -> int:
    """Bytes of device memory that training ``num_params`` parameters with ``plugin`` (a name of
    `plugins.PLUGINS`) and its ``options`` (merged with the plugin's defaults here) adds at the first backward and
    optimizer step, on each of ``world_size`` data-parallel ranks: Adam's moments, the gradients, and under mixed
    precision the master gradients (module docstring)."""
    if plugin not in PLUGINS:
        raise ValueError(f"unknown plugin {plugin!r}; choose one of {sorted(PLUGINS)}")
    if num_params < 0 or world_size < 1:
        raise ValueError(f"step_state_bytes: num_params ({num_params}) must be >= 0 and world_size ({world_size}) "
                         f">= 1")
    options = {**PLUGINS[plugin].defaults, **options}
    compute_bytes = torch.empty((), dtype=getattr(torch, precision_dtype(plugin, options))).element_size()
    stage = _zero_stage(plugin, options)
    optimizer_shards = world_size if stage >= 1 else 1
    gradient_shards = world_size if stage >= 2 else 1
    on_device = _optimizer_share_on_device(plugin, options)
    moments = ADAM_MOMENTS * FLOAT32_BYTES * num_params / optimizer_shards * on_device
    in_chunks = plugin == "gemini" and not options.get("enable_gradient_accumulation")
    in_buckets = stage == 0 and bool(options.get("gradient_as_bucket_view"))  # DDP's buckets, made at set-up
    gradients = 0.0 if in_chunks or in_buckets else compute_bytes * num_params / gradient_shards
    master_gradients = FLOAT32_BYTES * num_params / optimizer_shards * on_device if compute_bytes < 4 else 0.0
    return int(moments + gradients + master_gradients)


def trainable_parameters(modules: Iterable[torch.nn.Module]) -> int:
    """The number of parameters with ``requires_grad`` over ``modules`` (each parameter counted once)."""
    seen, total = set(), 0
    for module in modules:
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total
