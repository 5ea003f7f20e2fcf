"""A colocated engine that holds its own copy of the weights (vLLM) is sized to what is left of the device: it starts
after every other model of the run loaded, the trainer and the producer's reward model, with the trainer's
first-step reserve. Before, vLLM took its share of the free memory before the reward model loaded on the same
device. Shown with a registered backend whose ``fit_beside_trainer`` and build record when they run."""
from __future__ import annotations

from dataclasses import replace

import pytest

from coati_relay import rewards
from coati_relay.inference import registry
from tests.unit import fake_backend
from tests.unit.small_run import small_run_kwargs


@pytest.mark.slow
def test_the_engine_is_sized_and_built_after_the_reward_model_loaded(monkeypatch, tiny_model_path, tmp_path):
    from coati_relay import launch_distributed

    events = []

    def fit(kwargs, reserve_bytes):
        events.append(("fit", reserve_bytes))
        return dict(kwargs)

    def build(model_path, sampling, **kwargs):
        events.append(("engine", None))
        return fake_backend.SPEC.build(model_path, sampling, **kwargs)

    class RecordedScorer(rewards.RewardModelScorer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            events.append(("reward model", None))

    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    registry.register_backend(replace(fake_backend.SPEC, name="fitted", build=build, fit_beside_trainer=fit))
    monkeypatch.setattr(rewards, "RewardModelScorer", RecordedScorer)
    result = launch_distributed(**small_run_kwargs(
        tmp_path, tiny_model_path, inference_backend="fitted", colocate=True, progress=False,
        plugin_config={"plugin": "ddp"}, grpo_config={"lr": 1e-3},
        reward_model_config={"path": tiny_model_path}))
    assert [name for name, _ in events] == ["reward model", "fit", "engine"]
    assert events[1][1] > 0, "the trainer's first-step reserve"
    assert [h["version"] for h in result.history] == [1, 2]
