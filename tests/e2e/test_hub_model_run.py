"""A whole run whose model is given by Hugging Face Hub ID, from a local cache in the hub's layout (offline; nothing
reaches the Hub): it trains, and its checkpoint records the cached snapshot as the model it came from."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import run_kwargs

from coati_relay.toy import cache_as_hub_model

pytestmark = pytest.mark.slow

REPO = "toy-org/tiny-qwen"


def test_a_colocated_run_trains_a_model_given_by_hub_id(tiny_model_path, data, tmp_path, monkeypatch):
    from coati_relay import launch_distributed

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed local port, should anything ask
    snapshot = cache_as_hub_model(tiny_model_path, REPO)
    kw = run_kwargs(REPO, data, tmp_path / "run", backend="transformers", rounds=2, num_producers=1,
                    num_consumer_procs=1, inference_batch_size=8, train_batch_size=8, colocate=True)
    assert kw["inference_model_config"] == kw["train_model_config"] == {"path": REPO}
    result = launch_distributed(**kw)
    assert [h["version"] for h in result.history] == [1, 2]
    assert all(h["reward"] == h["reward"] for h in result.history), "rewards are numbers"
    source = Path(result.checkpoints[-1]) / "policy" / "source.json"
    assert json.loads(source.read_text())["model_path"] == str(snapshot)
