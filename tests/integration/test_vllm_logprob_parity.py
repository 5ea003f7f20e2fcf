"""A vLLM producer reloads weights; afterwards its behaviour log-probs equal the consumer's recomputation.

Model A is the tiny model, B the same architecture with other random weights. vLLM generates with A, loads B, and
generates again. An HF model holding the same weights recomputes the log-probs of the generated sequences at
temperature 1: they agree within ``TOLERANCE`` (max abs difference over response tokens, fp32) with the weights the
rollout was made with, and differ by far more with the other weights. One engine serves the whole module.
"""
from __future__ import annotations

import logging

import pytest
import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference import VLLMBackend
from coati_relay.roles.logprobs import response_logprobs
from coati_relay.toy import build_tiny_model

pytestmark = pytest.mark.slow
logger = logging.getLogger(__name__)

TOLERANCE = 1e-3
PROMPTS = [[3, 40, 41, 42, 43, 44], [7, 8], [10, 20, 30, 40], [100, 101, 102], [200], [5, 6, 7, 8, 9]]


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def models(tiny_model_path):
    return _hf(tiny_model_path), _hf(build_tiny_model(seed=1))


@pytest.fixture(scope="module")
def producer(tiny_model_path):
    backend = VLLMBackend(tiny_model_path, SamplingConfig(max_new_tokens=24, temperature=1.0, seed=3))
    logger.info("vLLM engine start: %.2f s", backend.start_seconds)
    yield backend
    backend.close()


def _max_diff(model, rollout) -> float:
    with torch.no_grad():
        recomputed = response_logprobs(model, rollout.sequences, rollout.attention_mask,
                                       rollout.response_ids.size(1), temperature=1.0)
    return float(((recomputed - rollout.logprobs) * rollout.response_mask).abs().max())


def test_logprobs_match_consumer_after_reload(producer, models, record_property):
    model_a, model_b = models
    before = producer.generate(PROMPTS, 4)
    assert before.weight_version == 0
    assert _max_diff(model_a, before) < TOLERANCE
    assert _max_diff(model_b, before) > 100 * TOLERANCE, "B's log-probs must not match A's rollout"

    producer.load_weights(1, dict(model_b.state_dict()))
    record_property("reload_seconds", producer.last_reload_seconds)
    logger.info("reload of the tiny model: %.4f s", producer.last_reload_seconds)
    after = producer.generate(PROMPTS, 4)
    assert after.weight_version == 1
    assert _max_diff(model_b, after) < TOLERANCE
    assert _max_diff(model_a, after) > 100 * TOLERANCE, "A's log-probs must not match B's rollout"


def test_partial_update_matches_merged_weights(producer, models):
    """A subset of weights (one fused q/k/v layer in vLLM, given in part) lands on top of the current ones."""
    model_a, model_b = models
    producer.load_weights(2, dict(model_b.state_dict()))
    part = {k: v for k, v in model_a.state_dict().items() if k.startswith("model.layers.0.self_attn.q_proj")}
    producer.load_weights(3, part)
    merged = _hf(build_tiny_model(seed=1))
    merged.load_state_dict(part, strict=False)
    rollout = producer.generate(PROMPTS, 2)
    assert rollout.weight_version == 3
    assert _max_diff(merged, rollout) < TOLERANCE
    assert _max_diff(model_b, rollout) > 10 * TOLERANCE, "the part must have changed the model"
