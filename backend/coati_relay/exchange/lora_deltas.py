"""LoRA deltas: the adapters of a peft-wrapped model, and ``W = W0 + scaling * B @ A`` from the base weights."""
from __future__ import annotations

from typing import Dict, Tuple

import torch


def lora_adapters(model: torch.nn.Module) -> Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]:
    """Adapters of a peft-wrapped model keyed by the HF name of the weight they modify.

    Returns {"model.layers.0.self_attn.q_proj.weight": (A [r, in], B [out, r], scaling)}.
    """
    out: Dict[str, Tuple[torch.Tensor, torch.Tensor, float]] = {}
    for name, module in model.named_modules():
        if not (hasattr(module, "lora_A") and hasattr(module, "scaling") and hasattr(module, "base_layer")):
            continue
        for adapter, lin_a in module.lora_A.items():
            lin_b = module.lora_B[adapter]
            hf_name = name
            for prefix in ("base_model.model.", "module."):
                if hf_name.startswith(prefix):
                    hf_name = hf_name[len(prefix):]
            out[hf_name + ".weight"] = (lin_a.weight.detach().cpu(), lin_b.weight.detach().cpu(),
                                        float(module.scaling[adapter]))
    return out


def lora_delta(a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """``scaling * B @ A`` in float32: A [r, in], B [out, r] -> [out, in]."""
    return scaling * (b.float() @ a.float())


def replace_delta(w0: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``W0 + delta`` in W0's dtype and device: the one way a LoRA push lands, on the engine's producers and on the
    legacy makers alike. Always from the base ``W0``, so a new push replaces the previous delta, never adds to it."""
    return (w0.float() + delta.to(device=w0.device, dtype=torch.float32)).to(w0.dtype)


def merge_lora(base: Dict[str, torch.Tensor],
               adapters: Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]) -> Dict[str, torch.Tensor]:
    """``W = W0 + scaling * B @ A`` for each adapted weight; W0 comes from ``base`` and is never modified."""
    merged = {}
    for name, (a, b, scaling) in adapters.items():
        if name not in base:
            raise KeyError(f"merge_lora: adapter for {name!r} but the base weights have no such tensor")
        merged[name] = replace_delta(base[name], lora_delta(a, b, scaling))
    return merged
