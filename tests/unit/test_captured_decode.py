"""The decode steps against the model's own forward on the CPU: the fused Llama-family step
(`coati_relay.inference.fused_step`) in the decode loop, and the captured path (`coati_relay.inference.captured_decode`)
around either step, give the same tokens and log-probs under a fixed seed as the loop over the model's forward, on
the toy Qwen2 and Llama and a GPT-2-shaped model. The unit tests run the captured step uncompiled (torch.compile's
``eager`` backend: the same static cache, masking and in-step sampling); the slow one compiles it with inductor."""
from __future__ import annotations

import pytest
import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.captured_decode import CapturedDecoder
from coati_relay.inference.fused_step import FusedStep, ModelStep, decode_step, fused_step_refusal
from coati_relay.inference.prompt_sharing import real_positions
from coati_relay.inference.transformers_backend import TransformersBackend
from coati_relay.toy import build_tiny_model

PROMPTS = [[5, 9, 14, 3], [7], [11, 12, 13, 14, 15, 16, 17]]
SETTINGS = {
    "sampled": SamplingConfig(max_new_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=3, ignore_eos=True),
    "plain": SamplingConfig(max_new_tokens=12, temperature=1.0, seed=4, ignore_eos=True),
    "greedy_stops": SamplingConfig(max_new_tokens=12, temperature=0.0, seed=5),
}


def _model_loop(backend: TransformersBackend, n: int = 4):
    """The rollout of the loop over the model's own forward (the reference), the backend's step put back after."""
    step, backend.step = backend.step, ModelStep(backend.model)
    try:
        return backend.generate(PROMPTS, n)
    finally:
        backend.step = step


def _captured(backend: TransformersBackend, compile_backend: str, n: int = 4, exact_window: bool = True):
    """The captured path's rollout around the backend's step; ``exact_window=False`` attends as on CUDA (the written
    columns rounded up to a multiple of 64)."""
    backend.captured = CapturedDecoder(backend.step, backend=compile_backend)
    backend.captured._exact_window = exact_window
    try:
        return backend.generate(PROMPTS, n)
    finally:
        backend.captured = None


def _assert_same(reference, other):
    assert torch.equal(reference.response_lengths, other.response_lengths)
    assert torch.equal(reference.response_ids * reference.response_mask, other.response_ids * other.response_mask)
    assert torch.allclose(reference.logprobs * reference.response_mask, other.logprobs * other.response_mask,
                          atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_fused_step_in_the_loop_matches_the_models_forward(arch, setting):
    backend = TransformersBackend(str(build_tiny_model(arch=arch)), SETTINGS[setting])
    assert isinstance(backend.step, FusedStep)
    _assert_same(_model_loop(backend), backend.generate(PROMPTS, 4))


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_captured_step_matches_the_models_forward(arch, setting):
    backend = TransformersBackend(str(build_tiny_model(arch=arch)), SETTINGS[setting])
    assert isinstance(backend.step, FusedStep if arch == "qwen2" else ModelStep)
    _assert_same(_model_loop(backend), _captured(backend, "eager"))


@pytest.mark.parametrize("setting", ["sampled", "greedy_stops"])
def test_captured_fused_step_attending_as_on_cuda_matches_the_models_forward(setting):
    backend = TransformersBackend(str(build_tiny_model()), SETTINGS[setting])
    _assert_same(_model_loop(backend), _captured(backend, "eager", exact_window=False))


def test_fused_step_on_a_llama_with_biases_tied_embeddings_and_scaled_rope(tmp_path):
    """Attention biases on every projection, the head tied to the embedding, llama3 rope scaling, two key/value
    heads for four query heads."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from coati_relay.toy import build_tokenizer, save_model_dir

    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attention_bias=True, tie_word_embeddings=True,
                         max_position_embeddings=256,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    torch.manual_seed(0)
    path = save_model_dir(AutoModelForCausalLM.from_config(config), tokenizer, tmp_path / "llama")
    backend = TransformersBackend(str(path), SETTINGS["sampled"])
    assert isinstance(backend.step, FusedStep)
    _assert_same(_model_loop(backend), backend.generate(PROMPTS, 4))


def test_in_bfloat16_the_fused_step_parts_from_the_forward_by_rounding_only():
    """bfloat16 rounds each step's operations differently: the first tokens' log-probs stay as close to float32's
    as the model's own bfloat16 forward is, on average over the rows (the largest of 24 is rounding's luck)."""
    one = SamplingConfig(max_new_tokens=1, temperature=1.0, seed=1, ignore_eos=True)
    path = str(build_tiny_model(hidden_size=256, num_layers=6))
    exact = TransformersBackend(path, one).generate(PROMPTS, 8).logprobs
    backend = TransformersBackend(path, one, dtype=torch.bfloat16)
    reference, fused = _model_loop(backend, 8).logprobs, backend.generate(PROMPTS, 8).logprobs
    assert (fused - reference).abs().max() < 1e-2
    assert (fused - exact).abs().mean() <= (reference - exact).abs().mean() + 1e-3


def test_fused_logits_equal_the_forwards_on_a_left_padded_batch():
    """One step after a prefill, rows of different prompt lengths: the fused logits [rows, V] are the model's."""
    backend = TransformersBackend(str(build_tiny_model(hidden_size=128, num_layers=2)), SETTINGS["plain"])
    model, fused = backend.model, FusedStep(backend.model)
    ids = torch.tensor([[0, 0, 5, 9], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    positions = mask.sum(dim=1) - 1
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask, position_ids=real_positions(mask)).logits
        cache = backend._prefill(ids, mask, torch.arange(2), 8)  # columns [0, P - 1); the step writes the last
        logits = fused(ids[:, -1], mask, positions, cache)
    assert torch.allclose(logits, reference[:, -1], atol=1e-5, rtol=0)


def test_the_fused_step_refuses_what_it_does_not_compute():
    from transformers import AutoModelForCausalLM

    gpt2 = AutoModelForCausalLM.from_pretrained(str(build_tiny_model(arch="gpt2")))
    assert "model_type 'gpt2'" in fused_step_refusal(gpt2)
    assert isinstance(decode_step(gpt2, fused=True), ModelStep)
    with pytest.raises(ValueError, match="fused_decode=False"):
        FusedStep(gpt2)
    qwen = AutoModelForCausalLM.from_pretrained(str(build_tiny_model()))
    assert fused_step_refusal(qwen) is None and isinstance(decode_step(qwen, fused=False), ModelStep)
    layer = qwen.model.layers[0].self_attn
    layer.q_proj = torch.nn.Sequential(layer.q_proj)  # a wrapped projection, as LoRA makes
    assert "plain torch.nn.Linear" in fused_step_refusal(qwen)
    qwen.config.sliding_window, qwen.config.use_sliding_window = 8, True
    assert "sliding window" in fused_step_refusal(qwen)
    qwen.config.use_sliding_window = False
    wrapper = torch.nn.Module()  # a model of the family's config in another layout
    wrapper.config, wrapper.model = qwen.config, torch.nn.Module()
    assert "not laid out as transformers' own class" in fused_step_refusal(wrapper)


def test_fused_step_reads_weights_loaded_between_calls():
    backend = TransformersBackend(str(build_tiny_model()), SETTINGS["sampled"])
    first = backend.generate(PROMPTS, 4)
    name = "model.layers.0.self_attn.k_proj.weight"  # read through the concatenated projection
    backend.load_weights(1, {name: backend._params[name].detach() * 0.5})
    reference = _model_loop(backend)
    second = backend.generate(PROMPTS, 4)
    assert not torch.equal(first.logprobs, second.logprobs)
    _assert_same(reference, second)


def test_a_bucket_is_reused_across_rounds_and_weight_loads():
    backend = TransformersBackend(str(build_tiny_model()), SETTINGS["sampled"])
    backend.captured = CapturedDecoder(backend.step, backend="eager")
    first = backend.generate(PROMPTS, 4)
    name, param = next(iter(backend.model.named_parameters()))
    before = param.data_ptr()
    backend.load_weights(1, {name: param.detach() * 0.5})
    second = backend.generate(PROMPTS, 4)
    assert param.data_ptr() == before and len(backend.captured.compile_s) == 1
    assert not torch.equal(first.logprobs, second.logprobs)  # the new weights are read by the same bucket


def test_decode_keys_are_checked_transformers_keys():
    from coati_relay.inference.transformers_spec import TRANSFORMERS_KEYS

    for key in ("compiled_decode", "fused_decode"):
        check = TRANSFORMERS_KEYS[key]
        assert check.ok(True) and check.ok(False) and not check.ok(1)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_inductor_step_matches_the_models_forward(arch):
    backend = TransformersBackend(str(build_tiny_model(arch=arch)), SETTINGS["sampled"])
    _assert_same(_model_loop(backend), _captured(backend, "inductor"))


@pytest.mark.slow
def test_a_bucket_compiles_once_and_its_phases_are_timed():
    """The fused step compiled with inductor: one compilation for a bucket, whatever the widths attended to and the
    prompts' width within the bucket, and each of its phases timed."""
    from coati_relay.inference.captured_decode import COMPILE_PHASES, compile_totals

    torch._dynamo.reset()  # a step compiled earlier in this process would be reused and traced no more
    backend = TransformersBackend(str(build_tiny_model()), SETTINGS["plain"])
    backend.captured = CapturedDecoder(backend.step)
    backend.generate(PROMPTS, 4)
    (phases,) = backend.captured.compile_phases.values()
    assert set(phases) == set(COMPILE_PHASES) and phases["trace"] > 0  # codegen and build: 0 from inductor's cache
    assert sum(phases.values()) <= next(iter(backend.captured.compile_s.values()))
    compiled = compile_totals()
    backend.generate([[3, 4], [8, 9, 10, 11, 12], [6]], 4)  # another width, the same bucket (12 rows, capacity 64)
    assert compile_totals() == compiled and len(backend.captured.compile_s) == 1
