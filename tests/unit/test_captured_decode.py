"""The captured decode path (`coati_relay.inference.captured_decode`) against the decode loop on the CPU: the same
tokens and log-probs under a fixed seed, on the toy Qwen2 and a GPT-2-shaped model. The unit tests run the step
uncompiled (torch.compile's ``eager`` backend: the same static cache, masking and in-step sampling); the slow one
compiles it with inductor."""
from __future__ import annotations

import pytest
import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.captured_decode import CapturedDecoder
from coati_relay.inference.transformers_backend import TransformersBackend
from coati_relay.toy import build_tiny_model

PROMPTS = [[5, 9, 14, 3], [7], [11, 12, 13, 14, 15, 16, 17]]
SETTINGS = {
    "sampled": SamplingConfig(max_new_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=3, ignore_eos=True),
    "plain": SamplingConfig(max_new_tokens=12, temperature=1.0, seed=4, ignore_eos=True),
    "greedy_stops": SamplingConfig(max_new_tokens=12, temperature=0.0, seed=5),
}


def _pair(backend: TransformersBackend, compile_backend: str, n: int = 4):
    """The loop's rollout and the captured path's, same seed, same prompts."""
    loop = backend.generate(PROMPTS, n)
    backend.captured = CapturedDecoder(backend.model, backend=compile_backend)
    try:
        return loop, backend.generate(PROMPTS, n)
    finally:
        backend.captured = None


def _assert_same(loop, captured):
    assert torch.equal(loop.response_lengths, captured.response_lengths)
    assert torch.equal(loop.response_ids * loop.response_mask, captured.response_ids * captured.response_mask)
    assert torch.allclose(loop.logprobs * loop.response_mask, captured.logprobs * captured.response_mask,
                          atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_captured_step_matches_the_loop(tmp_path, arch, setting):
    backend = TransformersBackend(str(build_tiny_model(arch=arch)), SETTINGS[setting])
    _assert_same(*_pair(backend, "eager"))


def test_a_bucket_is_reused_across_rounds_and_weight_loads():
    backend = TransformersBackend(str(build_tiny_model()), SETTINGS["sampled"])
    backend.captured = CapturedDecoder(backend.model, backend="eager")
    first = backend.generate(PROMPTS, 4)
    name, param = next(iter(backend.model.named_parameters()))
    before = param.data_ptr()
    backend.load_weights(1, {name: param.detach() * 0.5})
    second = backend.generate(PROMPTS, 4)
    assert param.data_ptr() == before and len(backend.captured.compile_s) == 1
    assert not torch.equal(first.logprobs, second.logprobs)  # the new weights are read by the same bucket


def test_compiled_decode_is_a_checked_transformers_key():
    from coati_relay.config.inference import TRANSFORMERS_KEYS

    check = TRANSFORMERS_KEYS["compiled_decode"]
    assert check.ok(True) and check.ok(False) and not check.ok(1)


@pytest.mark.slow
def test_inductor_step_matches_the_loop():
    backend = TransformersBackend(str(build_tiny_model()), SETTINGS["sampled"])
    _assert_same(*_pair(backend, "inductor"))
