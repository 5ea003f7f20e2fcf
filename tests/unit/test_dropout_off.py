"""Dropout is off in the models a run trains unless ``train_model_config['keep_dropout']`` keeps it: a PPO round on
an unchanged GPT-2-shaped policy (dropout 0.1, GPT2Config's default) reports a KL of exactly 0 against its reference,
where with dropout kept the train-mode forward differs from the eval-mode one."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from train_round_helpers import TokenCritic, make_config, make_rollout

from coati_relay.roles.consumer import ConsumerWorker
from coati_relay.training.dropout import disable_dropout

PROMPTS = [[3, 4, 5], [6, 7]]
RESPONSES = [[8, 9, 10], [11], [1, 2], [3, 4, 5, 6]]  # ids under TokenCritic's vocabulary (12)


@pytest.fixture(scope="module")
def gpt2_path():
    from coati_relay.toy import build_tiny_model

    return str(build_tiny_model(arch="gpt2"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from coati_relay.toy import write_toy_dataset

    return str(write_toy_dataset(tmp_path_factory.mktemp("data") / "p.jsonl", num_prompts=16))


def _gpt2(path: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def test_every_dropout_goes_to_zero_and_the_config_stays(gpt2_path):
    model = _gpt2(gpt2_path)
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(m.p == 0.1 for m in dropouts)
    attention = nn.Module()
    attention.attention_dropout = 0.2  # how Llama/Qwen2 attention holds its probability
    model.add_module("extra", attention)
    assert disable_dropout(model) == len(dropouts) + 1
    assert all(m.p == 0.0 for m in dropouts) and attention.attention_dropout == 0.0
    assert model.config.attn_pdrop == 0.1, "the saved config keeps the model's dropout"
    model.train()
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("keep", [False, True])
def test_ppo_first_round_kl_of_an_unchanged_dropout_policy(gpt2_path, data, keep):
    torch.manual_seed(0)
    cfg = make_config(gpt2_path, data, core_algo="PPO", group_size=2, kl_coef=0.1, lr=1e-6,
                      train_model={"keep_dropout": True} if keep else None)
    assert cfg.models.keep_dropout is keep
    behaviour = _gpt2(gpt2_path).eval()
    rollout = make_rollout(PROMPTS, RESPONSES, 2, [1.0, 0.0, 0.5, 0.0], policy=behaviour)
    worker = ConsumerWorker.for_models(cfg, _gpt2(gpt2_path), reference=_gpt2(gpt2_path), critic=TokenCritic())
    stats = worker.train_round(rollout)
    if keep:
        assert abs(stats["kl"]) > 1e-4, stats["kl"]
    else:
        assert stats["kl"] == 0.0, stats["kl"]
        assert f"{stats['kl']:.3f}" == "0.000"
