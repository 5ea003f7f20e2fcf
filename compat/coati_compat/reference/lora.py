"""Reference legacy LoRA weight push (legacy_spec §A.5, §A.6), *including* the legacy accumulation: every push
adds ``scaling * B @ A`` to the maker's current weight, so after k pushes it holds ``W0 + dW_1 + ... + dW_k``.

State dicts and configs are plain: ``{prefix.lora_A: [r,in], prefix.lora_B: [out,r]}`` in module order and
``{prefix: (r, lora_alpha, fan_in_fan_out)}``. Nothing here imports the shims.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

LoraSpec = Tuple[int, float, bool]  # (r, lora_alpha, fan_in_fan_out)


def reconstruct_increase(lora_state_dict: Dict[str, torch.Tensor],
                         configs: Dict[str, LoraSpec]) -> Dict[str, torch.Tensor]:
    """Walks the state dict in order, expecting ``<prefix>.lora_A`` then ``<prefix>.lora_B`` for each layer, and
    returns ``{<prefix>.weight: T(B @ A) * alpha / r}`` (0 for r == 0). Any other key raises ValueError."""
    increase: Dict[str, torch.Tensor] = {}
    pending_a = None
    for key, tensor in lora_state_dict.items():
        if key.endswith(".lora_A"):
            pending_a = (key[: -len(".lora_A")], tensor)
        elif key.endswith(".lora_B") and pending_a is not None and pending_a[0] == key[: -len(".lora_B")]:
            prefix, a = pending_a
            r, alpha, fan_in_fan_out = configs[prefix]
            if r == 0:
                increase[prefix + ".weight"] = torch.zeros(())
            else:
                delta = torch.matmul(tensor, a) * (alpha / r)
                increase[prefix + ".weight"] = delta.t() if fan_in_fan_out else delta
            pending_a = None
        else:
            raise ValueError(f"unexpected key {key}")
    return increase


def load_increase(weights: Dict[str, torch.Tensor], increase: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The legacy ``load_state_dict_increase``: a new dict with ``W + dW`` for each increased key (accumulates)."""
    return {k: (v + increase[k] if k in increase else v.clone()) for k, v in weights.items()}


def push_lora(weights: Dict[str, torch.Tensor], lora_state_dict: Dict[str, torch.Tensor],
              configs: Dict[str, LoraSpec]) -> Dict[str, torch.Tensor]:
    """One legacy LoRA sync on a maker: the weights after applying the pushed adapters."""
    return load_increase(weights, reconstruct_increase(lora_state_dict, configs))
