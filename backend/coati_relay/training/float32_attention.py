"""Attention in float32 for transformers models whose forwards run under bf16 autocast on a CPU.

On the CPU, ``scaled_dot_product_attention`` runs torch's flash-attention kernel, whose backward is about 3x slower in
bfloat16 than in float32, while bf16 matmuls run 2.5x faster (AMX). Measured on the 3.5M-parameter toy model, 16
sequences of 157 tokens, forward and backward, 2 threads: float32 0.56 s; bf16 autocast 0.39 s, of which the
attention backward took 37%; bf16 autocast with float32 attention 0.21-0.26 s. So such a model computes its
attention in float32 (`use_float32_attention`): query, key and value cast up, the output cast back to their dtype;
every other matmul stays in bf16.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import nn

NAME = "sdpa_float32"


def _sdpa_float32(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Optional[torch.Tensor], **kwargs: Any) -> Tuple[torch.Tensor, Any]:
    """transformers' sdpa attention on float32 query [B, H, S, D], key and value [B, KV, S, D] with autocast off;
    the output [B, S, H, D] in the query's dtype."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(query.dtype), weights


def use_float32_attention(model: nn.Module) -> bool:
    """Makes a transformers model on sdpa attention (the default) compute it with `_sdpa_float32`; returns whether
    it did (not for another attention implementation, nor a model that is not a transformers model). Not saved
    with the model: its config keeps no private attention setting."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, _sdpa_float32)
    model.set_attn_implementation(NAME)
    return True
