"""A random model of Qwen2.5-0.5B's shape, built here: the real size the toy models of the other benchmarks hide.

Shape (Qwen2.5-0.5B's config): hidden 896, 24 layers, 14 query heads and 2 key/value heads of 64, MLP 4864, q/k/v
biases, RMSNorm eps 1e-6, RoPE theta 1e6, a 151,936-token vocabulary with tied embeddings: 494M parameters, 136M of
them the embedding. The tokenizer is the toy one (`coati_relay.toy.build_tokenizer`, 320 tokens): sampled ids beyond
it decode to nothing, which leaves every cost of the vocabulary (its logits, log-softmax and embedding gradient) in
place.
"""
from __future__ import annotations

from pathlib import Path

SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
             num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6,
             rope_theta=1000000.0, max_position_embeddings=4096)


def build_real_size_model(seed: int = 0) -> Path:
    """Writes the model and the toy tokenizer to the cache directory (once) and returns the directory."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from coati_relay.toy import build_tokenizer, default_cache_dir, save_model_dir

    path = default_cache_dir() / f"qwen2.5-0.5b-shape-s{seed}"
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    tokenizer = build_tokenizer()
    config = Qwen2Config(**SHAPE, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    return save_model_dir(AutoModelForCausalLM.from_config(config, dtype=torch.float32), tokenizer, path)
