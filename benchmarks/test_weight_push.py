"""Pair 3, weight push: the trainer's new weights reach the model that generates.

- old: the legacy ``_update_remote_makers`` payload path: ``state_dict_to`` (every tensor to fp16 on the CPU), the
  state dict through the object store (the argument of ``update_experience_maker.remote``), then
  ``actor.model.load_state_dict(sd, strict=False)`` on the maker's model.
- new: ``ObjectStorePublisher.publish`` (a CPU copy of the weights, one flat buffer per dtype, ``ray.put`` once, the
  version announced to a real weight-store actor), ``ObjectStoreSubscriber.fetch`` (wait for the version, ``ray.get``,
  views back into named tensors) and ``load_weights`` into the inference backend: transformers (copies into the
  parameters) or vLLM (the engine's in-place ``reload_weights``, which repacks the CPU kernels' weights).

The trainer holds other weights (another seed) than the makers started with, so every push changes them. Both
sides move every parameter of the medium model (about 18M); the legacy one moves half the bytes (fp16) and rounds
the weights. The vLLM engine runs eager here: compilation changes its generation, not its reload path.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from coati_compat.reference.ray_helpers import state_dict_to
from coati_relay.config.schema import SamplingConfig

ROUNDS, WARMUP, SEED, TIMEOUT_S = 10, 1, 0, 120.0
PROMPTS = [[3, 40, 41, 42, 43, 44], [7, 8, 9], [100, 101, 102, 103]]
VLLM_KWARGS = {"enforce_eager": True}


@pytest.fixture(scope="module")
def vllm_model_path(medium_model_path):
    return medium_model_path


@pytest.fixture(scope="module")
def trainer():
    """A Booster-wrapped policy holding the medium model's shape with other random weights (seed 1)."""
    from coati_relay.toy import build_tiny_model
    from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm

    other = build_tiny_model(hidden_size=512, num_layers=8, seed=1)
    return TrainingBackend(load_causal_lm(other), lr=1e-7)


def _group(trainer) -> str:
    numel = sum(p.numel() for p in trainer.unwrapped().parameters())
    return f"weight push (h512-l8, {numel / 1e6:.1f}M parameters)"


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def test_legacy_push(benchmark, work, ray_session, trainer, medium_model_path):
    from transformers import AutoModelForCausalLM

    from coati_compat.legacy.model_base import Actor

    ray = ray_session
    maker_actor = Actor(AutoModelForCausalLM.from_pretrained(medium_model_path, dtype=torch.float32))

    def push():
        shard = state_dict_to(trainer.unwrapped().state_dict())
        received = ray.get(ray.put(shard), timeout=TIMEOUT_S)
        maker_actor.model.load_state_dict(received, strict=False)
        return received

    benchmark.group = _group(trainer)
    received = benchmark.pedantic(push, rounds=ROUNDS, warmup_rounds=WARMUP)
    work["bytes"] = _nbytes(received)
    work["parameters"] = sum(t.numel() for t in received.values())
    source = trainer.unwrapped().state_dict()
    loaded = maker_actor.model.state_dict()
    assert set(received) == set(source)
    for name, weight in source.items():
        assert received[name].dtype == torch.float16
        assert torch.equal(loaded[name], weight.half().float()), name


def _engine_push(trainer, publisher, subscriber, backend, versions):
    version = next(versions)
    publisher.publish(version, tensors=trainer.state_dict_for_inference(), timeout_s=TIMEOUT_S)
    fetched_version, tensors = subscriber.fetch(version, timeout_s=TIMEOUT_S)
    backend.load_weights(fetched_version, tensors)
    return tensors


@pytest.mark.parametrize("backend_name", ["transformers", "vllm"])
def test_engine_push(benchmark, work, request, ray_session, trainer, backend_name, medium_model_path):
    from coati_relay.exchange.weight_store import make_weight_store
    from coati_relay.exchange.weight_sync import ObjectStorePublisher, ObjectStoreSubscriber

    if backend_name == "vllm":
        backend = request.getfixturevalue("vllm_backend")
    else:
        from coati_relay.inference import TransformersBackend

        backend = TransformersBackend(medium_model_path, SamplingConfig(), seed=SEED)
    store = make_weight_store()
    versions = itertools.count(backend.weight_version + 1)
    benchmark.group = _group(trainer)
    tensors = benchmark.pedantic(
        _engine_push, args=(trainer, ObjectStorePublisher(store), ObjectStoreSubscriber(store), backend, versions),
        rounds=ROUNDS, warmup_rounds=WARMUP)
    work["bytes"] = _nbytes(tensors)
    work["parameters"] = sum(t.numel() for t in tensors.values())
    source = trainer.unwrapped().state_dict()
    assert set(tensors) == set(source) and work["parameters"] == sum(t.numel() for t in source.values())
    assert backend.weight_version == next(versions) - 1
    if backend_name == "transformers":
        loaded = backend.model.state_dict()
        for name, weight in source.items():
            assert torch.equal(loaded[name], weight), name
    else:
        _assert_generates_with(backend, trainer.unwrapped())
    ray_session.kill(store)


def _assert_generates_with(backend, model) -> None:
    """The engine's behaviour log-probs are those of ``model`` (the pushed weights), not of its initial ones."""
    from coati_relay.roles.logprobs import response_logprobs

    backend.sampling = SamplingConfig(max_new_tokens=16, temperature=1.0, seed=SEED)
    rollout = backend.generate(PROMPTS, 2)
    with torch.no_grad():
        recomputed = response_logprobs(model.eval(), rollout.sequences, rollout.attention_mask,
                                       rollout.response_ids.size(1))
    assert ((recomputed - rollout.logprobs) * rollout.response_mask).abs().max() < 1e-3
