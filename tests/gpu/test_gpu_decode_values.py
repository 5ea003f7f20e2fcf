"""The transformers backend's decode paths on CUDA, checked by value: the fused step and the captured step (compiled,
CUDA graphs) give the tokens and log-probs of the loop over the model's own forward, exactly in float32 and within
a stated bound in bfloat16, on a Qwen2 with non-zero query/key/value biases as real checkpoints have; and a decode
across more than 8 attended widths stays compiled (no dynamo recompile-limit warning) at a flat time per token."""
from __future__ import annotations

import time

import torch
from gpu_lane import MARKS

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.captured_decode import CapturedDecoder
from coati_relay.inference.fused_step import FusedStep, ModelStep
from coati_relay.inference.transformers_backend import TransformersBackend

pytestmark = MARKS

PROMPTS = [[5 + i, 9, 14, 3 + i, 20 + i][: 2 + i % 4] for i in range(8)]
BF16_MEAN, BF16_MAX = 1e-2, 5e-2  # |log-prob| gaps of the first token in bfloat16, mean and largest over the rows


def _qwen2_with_biases(tmp_path, max_positions: int = 512) -> str:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from coati_relay.toy import build_tokenizer, save_model_dir

    tokenizer = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return str(save_model_dir(model, tokenizer, tmp_path / f"qwen2-biases-{max_positions}"))


def _rollouts(path: str, sampling: SamplingConfig, dtype: torch.dtype):
    """{path name: rollout} of the model-forward loop, the fused loop and the captured step, one backend each."""
    out = {}
    for name, fused, compiled in (("forward", False, False), ("fused", True, False), ("captured", True, True)):
        backend = TransformersBackend(path, sampling, device="cuda", dtype=dtype, fused_decode=fused,
                                      compiled_decode=compiled)
        assert isinstance(backend.step, FusedStep if fused else ModelStep)
        out[name] = backend.generate(PROMPTS, 8)
    return out


def test_fused_and_captured_decode_equal_the_models_forward_in_float32(tmp_path):
    sampling = SamplingConfig(max_new_tokens=32, temperature=0.8, top_k=50, seed=3, ignore_eos=True)
    got = _rollouts(_qwen2_with_biases(tmp_path), sampling, torch.float32)
    reference = got.pop("forward")
    for name, rollout in got.items():
        assert torch.equal(rollout.response_ids, reference.response_ids), name
        gap = float((rollout.logprobs - reference.logprobs).abs().max())
        assert gap < 1e-4, f"{name}: log-probs {gap:.2e} from the forward's"


def test_fused_and_captured_decode_stay_within_the_bf16_bound(tmp_path):
    sampling = SamplingConfig(max_new_tokens=1, temperature=1.0, seed=3, ignore_eos=True)
    got = _rollouts(_qwen2_with_biases(tmp_path), sampling, torch.bfloat16)
    reference = got.pop("forward").logprobs
    for name, rollout in got.items():
        gap = (rollout.logprobs - reference).abs()
        assert float(gap.mean()) < BF16_MEAN and float(gap.max()) < BF16_MAX, (name, float(gap.mean()),
                                                                               float(gap.max()))


def test_a_decode_across_many_widths_stays_compiled_at_a_flat_time_per_token(tmp_path, dynamo_warnings):
    """1,500 new tokens cross 24 multiples of 64 columns; the attended width is symbolic and rounded to at most 8
    sizes a bucket, so nothing recompiles past dynamo's limit of 8 and the time per token of the long decode stays
    within 1.5x of a short one (a small model at batch 16 is bound by launches, not by the growing context)."""
    path = _qwen2_with_biases(tmp_path, max_positions=2048)
    per_token = {}
    for steps in (200, 1500):
        sampling = SamplingConfig(max_new_tokens=steps, temperature=1.0, seed=3, ignore_eos=True)
        backend = TransformersBackend(path, sampling, device="cuda", compiled_decode=True)
        backend.generate(PROMPTS[:2], 8)  # the warm-up: compilation and CUDA graphs
        torch.cuda.synchronize()
        start = time.perf_counter()
        backend.generate(PROMPTS[:2], 8)
        torch.cuda.synchronize()
        per_token[steps] = (time.perf_counter() - start) / steps
        assert isinstance(backend.captured, CapturedDecoder) and len(backend.captured._compiled) == 1
    print(f"per token: {per_token[200] * 1e3:.3f} ms over 200, {per_token[1500] * 1e3:.3f} ms over 1,500; "
          f"device {torch.cuda.get_device_name()}")
    assert not [m for m in dynamo_warnings if "recompile_limit" in m], dynamo_warnings
    assert per_token[1500] <= 1.5 * per_token[200], per_token


def test_sleep_frees_the_decoders_memory_on_cuda(tmp_path):
    """`TransformersBackend.sleep` (a colocated run calls it before training) gives back the captured buckets and the
    fused step's concatenated projections."""
    sampling = SamplingConfig(max_new_tokens=64, temperature=1.0, seed=3, ignore_eos=True)
    backend = TransformersBackend(_qwen2_with_biases(tmp_path), sampling, device="cuda", compiled_decode=True)
    backend.generate(PROMPTS, 8)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    expected = backend.captured.held_bytes()
    backend.sleep()
    torch.cuda.synchronize()
    assert expected > 0 and torch.cuda.memory_allocated() <= held - expected, (held, expected)
