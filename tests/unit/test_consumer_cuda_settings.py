"""What a consumer asks of its plugin and models for a CUDA host, checked on the CPU: the plugin keywords (Gemini's
gradient accumulation), the reference model's dtype (the training precision's), eval mode (no dropout) for the
forwards without gradient and train mode for the update."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from train_round_helpers import BigramLM, TokenCritic, make_config

from coati_relay.consumer import ConsumerWorker
from coati_relay.run_config import Plugin
from coati_relay.training import booster_backend


@pytest.fixture(scope="module")
def paths(tiny_model_path, tmp_path_factory):
    from coati_relay.toy import write_toy_dataset

    return tiny_model_path, str(write_toy_dataset(tmp_path_factory.mktemp("data") / "p.jsonl", num_prompts=16))


class RecordedBackend:
    """Stands for `TrainingBackend`: records its keywords; trains nothing."""

    made: list = []

    def __init__(self, model, lr, **kwargs):
        self.made.append(kwargs)
        self.device = torch.device("cpu")
        self.compute_dtype = torch.bfloat16


@pytest.mark.parametrize("microbatch, accumulates", [(2, True), (8, False)])
def test_gemini_gets_gradient_accumulation_when_the_consumer_accumulates(paths, monkeypatch, microbatch, accumulates):
    cfg = make_config(*paths, core_algo="PPO", train_batch_size=4, group_size=2, microbatch=microbatch)
    cfg = replace(cfg, plugin=Plugin("gemini", {"precision": "bf16"}, allow_cpu_fallback=False))
    monkeypatch.setattr(booster_backend, "TrainingBackend", RecordedBackend)
    RecordedBackend.made = []
    ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1), critic=TokenCritic())
    assert [kw["plugin"] for kw in RecordedBackend.made] == ["gemini", "gemini"], "policy and critic"
    for kw in RecordedBackend.made:
        expected = {"precision": "bf16", **({"enable_gradient_accumulation": True} if accumulates else {})}
        assert kw["plugin_options"] == expected
