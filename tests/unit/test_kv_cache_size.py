"""A vLLM engine's CPU KV cache sized to the run (`coati_relay.inference.kv_cache_size`): the bytes of its rows'
keys and values, the variable that would override the size hidden while the engine starts, and the CPU defaults."""
from __future__ import annotations

import os

import pytest
import torch
from transformers import Qwen2Config

from coati_relay.inference.kv_cache_size import (
    KVCACHE_ENV,
    kv_bytes_per_token,
    run_kv_cache_bytes,
    without_kvcache_env,
)

MiB = 2 ** 20


def _config(**kw):
    base = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
                intermediate_size=512, vocab_size=320)
    return Qwen2Config(**{**base, **kw})


def test_bytes_per_token_counts_keys_and_values_of_every_layer():
    # 2 (K, V) x 6 layers x 1 KV head x 64 (256 / 4) x 4 bytes
    assert kv_bytes_per_token(_config(), torch.float32) == 3072
    # grouped heads: 2 KV heads of 32 (128 / 4), 2 layers, bf16
    assert kv_bytes_per_token(_config(hidden_size=128, num_hidden_layers=2, num_key_value_heads=2),
                              torch.bfloat16) == 2 * 2 * 2 * 32 * 2


def test_run_size_rounds_rows_to_blocks_with_headroom():
    # 64 rows x 192 tokens -> 2 blocks of 128 a row = 16,384 tokens x 3 KiB = 48 MiB, x 1.25 = 60 MiB
    assert run_kv_cache_bytes(_config(), torch.float32, rows=64, max_model_len=192) == 60 * MiB
    # one row of one token still takes a whole block: 128 x 3 KiB x 1.25 = 480 KiB, rounded up to 1 MiB
    assert run_kv_cache_bytes(_config(), torch.float32, rows=1, max_model_len=1) == MiB
    assert run_kv_cache_bytes(_config(), torch.float32, rows=64, max_model_len=192) < 2 ** 30  # not the fixed GiB


@pytest.mark.parametrize("rows, length", [(0, 192), (8, 0)])
def test_run_size_rejects_empty_runs(rows, length):
    with pytest.raises(ValueError, match="must be >= 1"):
        run_kv_cache_bytes(_config(), torch.float32, rows=rows, max_model_len=length)


def test_the_variable_is_hidden_while_the_engine_starts_and_restored(monkeypatch):
    monkeypatch.setenv(KVCACHE_ENV, "1")
    with without_kvcache_env():
        assert KVCACHE_ENV not in os.environ
    assert os.environ[KVCACHE_ENV] == "1"
    with pytest.raises(RuntimeError, match="engine failed"):
        with without_kvcache_env():
            raise RuntimeError("engine failed")
    assert os.environ[KVCACHE_ENV] == "1"
    monkeypatch.delenv(KVCACHE_ENV)
    with without_kvcache_env():
        pass
    assert KVCACHE_ENV not in os.environ


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU hosts' defaults")
def test_cpu_engine_defaults_leave_a_sized_cache_alone_and_keep_set_values(monkeypatch):
    from coati_relay.inference.vllm_backend import _cpu_env_defaults

    for name in (KVCACHE_ENV, "VLLM_USE_AOT_COMPILE"):
        monkeypatch.delenv(name, raising=False)
    _cpu_env_defaults(sized=True)
    assert KVCACHE_ENV not in os.environ  # would override the run's size
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "0"  # the compile cache that loads on this vLLM
    _cpu_env_defaults(sized=False)
    assert os.environ[KVCACHE_ENV] == "1"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    _cpu_env_defaults(sized=False)
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "1"  # a user's choice stays
