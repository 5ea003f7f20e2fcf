"""The fused Llama-family step (`coati_relay.inference.fused_step.FusedStep`) where test models are kind to it: a
sharp attention in bfloat16, whose scores it keeps in float32 as SDPA does, and non-zero query/key/value biases, as
real Qwen2 checkpoints have (a freshly built model's are zero)."""
from __future__ import annotations

import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.fused_step import FusedStep, ModelStep
from coati_relay.inference.transformers_backend import TransformersBackend
from coati_relay.toy import build_tiny_model


def test_bfloat16_attention_scores_are_kept_in_float32():
    """Queries and keys of scale 3 make scores of tens, which bfloat16 rounds by tenths: the attention then parts
    from the float32 attention of the same bfloat16 inputs by several times what SDPA's bfloat16 output does."""
    from transformers import AutoModelForCausalLM

    step = FusedStep(AutoModelForCausalLM.from_pretrained(str(build_tiny_model(hidden_size=256, num_layers=2))))
    generator = torch.Generator().manual_seed(0)
    rows, kv, group, width, d = 8, step.kv_heads, step.heads // step.kv_heads, 200, step.head_dim
    q = (3 * torch.randn(rows, kv, group, d, generator=generator)).bfloat16()
    keys = (3 * torch.randn(rows, kv, width, d, generator=generator)).bfloat16()
    values = torch.randn(rows, kv, width, d, generator=generator).bfloat16()
    bias = torch.zeros(rows, 1, 1, width)
    bias[..., :5] = float("-inf")  # left padding
    exact = torch.softmax(q.float() @ keys.float().transpose(-1, -2) * step.scale + bias, dim=-1) @ values.float()
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=bias.bfloat16())
    error = (step.attend(q, keys, values, bias).float() - exact).abs().max()
    assert error <= 2 * (sdpa.float() - exact).abs().max() and error < 0.03, float(error)


def test_the_fused_step_with_non_zero_qkv_biases_matches_the_models_forward():
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.8, top_k=20, seed=3, ignore_eos=True)
    backend = TransformersBackend(str(build_tiny_model(hidden_size=128, num_layers=2)), sampling)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in backend.model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.copy_(0.5 * torch.randn(proj.bias.shape, generator=generator))
    prompts = [[5, 9, 14, 3], [7], [11, 12, 13, 14, 15]]
    assert isinstance(backend.step, FusedStep)
    fused = backend.generate(prompts, 4)
    backend.step = ModelStep(backend.model)
    reference = backend.generate(prompts, 4)
    assert torch.equal(fused.response_ids, reference.response_ids)
    assert torch.allclose(fused.logprobs, reference.logprobs, atol=1e-5, rtol=0)
