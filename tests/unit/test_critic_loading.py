"""PPO's critic loads its base model from a causal LM's checkpoint without transformers' load-report table (the LM
head is the one key a base model does not take); any other difference between checkpoint and model is one warning."""
from __future__ import annotations

import logging
import shutil

import torch

from coati_relay.training.critic import CriticModel


def test_a_causal_lm_checkpoint_loads_without_a_report(tiny_model_path, caplog):
    with caplog.at_level(logging.INFO):
        critic = CriticModel.from_pretrained(tiny_model_path)
    assert not [r for r in caplog.records if "LOAD REPORT" in r.getMessage() or r.levelno >= logging.WARNING]
    assert critic(torch.tensor([[3, 4, 5]]), torch.ones(1, 3, dtype=torch.long)).shape == (1, 3)


def test_a_checkpoint_with_other_keys_is_one_warning(tiny_model_path, tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other"
    shutil.copytree(tiny_model_path, other)
    weights = load_file(str(other / "model.safetensors"))
    weights["model.extra_probe.weight"] = torch.zeros(2)
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        CriticModel.from_pretrained(other)
    [warned] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned.startswith(f"critic base model from {other}: missing [], unexpected [") and "extra_probe" in warned
