"""How many forwards `ConsumerWorker.train_round` runs, counted by a wrapper around each model: the reference model
only when its KL weight is > 0, the policy without gradient only where the sampler truncated (top-k/top-p), for
any number of PPO epochs; otherwise one forward with gradient per micro-batch of each optimizer step."""
from __future__ import annotations

import math
from typing import List

import pytest
import torch
from torch import nn
from train_round_helpers import BigramLM, make_config, make_rollout

from coati_relay.roles.consumer import ConsumerWorker

PROMPTS = [[3, 4, 5], [6], [7, 8], [9, 10]]
RESPONSES = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [2, 2], [3, 11, 4], [5], [6, 7, 8]]
REWARDS = [1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.0, 1.0]


class Counted(nn.Module):
    """A model that records, for each forward, whether gradients were enabled and how many rows it took."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.calls: List[tuple] = []

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        self.calls.append((torch.is_grad_enabled(), input_ids.size(0)))
        return self.inner(input_ids, attention_mask=attention_mask, position_ids=position_ids)

    def counts(self) -> tuple:
        """(forwards with gradient, forwards without)."""
        with_grad = sum(g for g, _ in self.calls)
        return with_grad, len(self.calls) - with_grad


@pytest.fixture(scope="module")
def paths(tiny_model_path, tmp_path_factory):
    from coati_relay.toy import write_toy_dataset

    return tiny_model_path, str(write_toy_dataset(tmp_path_factory.mktemp("data") / "p.jsonl", num_prompts=16))


def _round(cfg, beta: float):
    policy = Counted(BigramLM())
    reference = Counted(BigramLM(seed=1)) if beta > 0 else None
    rollout = make_rollout(PROMPTS, RESPONSES, 2, REWARDS, policy=BigramLM())
    policy.calls.clear()
    ConsumerWorker.for_models(cfg, policy, reference=reference).train_round(rollout)
    return policy, reference


@pytest.mark.parametrize("epochs", [1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("generate", [None, {"top_k": 4}, {"top_p": 0.9}])
def test_forwards_per_round(paths, epochs, beta, generate):
    micro = 3  # 8 rows: steps of 4 rows (train_batch_size 2 x G 2), each in micro-batches of 3 and 1
    cfg = make_config(*paths, train_batch_size=2, microbatch=micro, ppo_epochs=epochs, beta=beta, generate=generate)
    policy, reference = _round(cfg, beta)
    truncated = generate is not None
    with_grad, without = policy.counts()
    assert with_grad == epochs * 2 * 2, "one forward with gradient per micro-batch of each optimizer step"
    assert without == (math.ceil(8 / micro) if truncated else 0), \
        "old log-probs are recomputed only for a truncated sampler"
    assert all(rows <= micro for _, rows in policy.calls)
    if beta > 0:
        assert reference.counts() == (0, math.ceil(8 / micro)), "reference: once per round, without gradient"
