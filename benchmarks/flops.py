"""FLOP counts of a decoder-only transformer from its shapes, and this machine's measured matmul peak.

Counts are multiply-adds x 2 of the matmuls (projections, MLP, LM head, attention scores and values); norms,
activations and softmax are left out. Training a token costs three forwards (forward, and a backward of twice the
forward). Where the samples of a prompt share its forward (`coati_relay.inference.prompt_sharing`, in the transformers
backend's prefill and in the consumer's training forward), the prompt's tokens are counted once per prompt.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, Optional


def model_shapes(model_dir: str) -> Dict[str, int]:
    """hidden, layers, intermediate, heads, kv_heads, head_dim, vocab from a Hugging Face ``config.json``."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    return {"hidden": cfg["hidden_size"], "layers": cfg["num_hidden_layers"],
            "intermediate": cfg["intermediate_size"], "heads": heads,
            "kv_heads": cfg.get("num_key_value_heads", heads),
            "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads, "vocab": cfg["vocab_size"]}


def forward_flops_per_token(s: Dict[str, int], context: float) -> float:
    """FLOPs of one token's forward pass attending to ``context`` tokens (itself included)."""
    q = s["heads"] * s["head_dim"]
    kv = s["kv_heads"] * s["head_dim"]
    proj = s["hidden"] * (q + 2 * kv) + q * s["hidden"]
    mlp = 3 * s["hidden"] * s["intermediate"]
    attention = 2 * q * context  # scores and the weighted sum of values
    return 2.0 * (s["layers"] * (proj + mlp + attention) + s["hidden"] * s["vocab"])


def generation_flops(s: Dict[str, int], samples: int, prompt_len: int, new_tokens: float,
                     prompts: Optional[int] = None) -> float:
    """Prefill of the prompts of ``prompt_len`` tokens, then ``new_tokens`` sampled tokens per sample (a mean, may be
    fractional), each attending to everything before it (with a KV cache). ``prompts``: how many distinct prompts
    are prefilled, their samples sharing the cache (None: every sample prefills its own)."""
    prefill = (samples if prompts is None else prompts) * prompt_len * forward_flops_per_token(s, (prompt_len + 1) / 2)
    decode = samples * new_tokens * forward_flops_per_token(s, prompt_len + (new_tokens + 1) / 2)
    return prefill + decode


def training_flops(s: Dict[str, int], samples: int, prompt_len: int, new_tokens: float,
                   prompts: Optional[int] = None) -> float:
    """Forward and backward of the policy over ``samples`` causal sequences of a prompt and ``new_tokens`` response
    tokens. ``prompts``: as in `generation_flops` (the samples of a prompt share its forward and backward)."""
    if prompts is None:
        seq_len = prompt_len + new_tokens
        return 3.0 * samples * seq_len * forward_flops_per_token(s, (seq_len + 1) / 2)
    prompt = prompts * prompt_len * forward_flops_per_token(s, (prompt_len + 1) / 2)
    response = samples * new_tokens * forward_flops_per_token(s, prompt_len + (new_tokens + 1) / 2)
    return 3.0 * (prompt + response)


def matmul_peak_flops(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
    """The best FLOP/s of ``torch.mm`` of two ``n x n`` matrices of ``dtype`` over ``repeats`` calls, with torch's
    current thread count (the practical ceiling of these CPUs for the dense work of a step)."""
    import torch

    a, b = torch.randn(n, n, dtype=getattr(torch, dtype)), torch.randn(n, n, dtype=getattr(torch, dtype))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best
