"""The advantage estimators a run dispatches to by ``core_algo``, registered under kind ``"advantage"``.

Each has the one signature of its kind, ``fn(inputs: AdvantageInputs, params) -> Advantages``, where ``params`` is
the run's algorithm settings (`coati_relay.config.algorithm.AlgorithmConfig`: attributes ``beta``, ``kl_coef``,
``gamma``, ``lam``, ``normalize_advantages``, ...). Shapes: N sequences (prompt-major, G per prompt), R response
tokens.

- ``grpo``, ``dapo``: ``(r - mean_g) / (std_g + eps)`` per group; [N, 1]. As in ColossalChat, DAPO is the same
  advantage with the same defaults: its filters, clip and loss are the ``grpo_config`` keys a DAPO run sets.
- ``rloo``: r minus the mean of the other G - 1 rewards; [N, 1].
- ``reinforce_ppb``: ``r - mean_g``, minus ``beta * KL`` (``kl_estimator``, k3 by default) with a reference model,
  whitened over the valid tokens of the global batch (every data-parallel rank's: a collective); [N, R]; the KL is
  in the advantages, not in the loss.
- ``ppo``: per-token rewards ``-kl_coef * k1`` plus r on the last token, GAE over the critic's values (whitened when
  ``normalize_advantages``); advantages and returns [N, R].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from coati_relay.algorithms.advantages import gae, group_advantage, kl_folded_advantages
from coati_relay.algorithms.kl import kl_estimate, token_level_rewards
from coati_relay.algorithms.masked import whiten
from coati_relay.algorithms.registry import AlgorithmSpec, register


@dataclass
class AdvantageInputs:
    """rewards: [N]; group_size: G; mask: [N,R] response tokens; logprobs: [N,R] behaviour log-probs;
    ref_logprobs: [N,R] of the reference model (None without one); values: [N,R] critic values (None without)."""

    rewards: torch.Tensor
    group_size: int
    mask: torch.Tensor
    logprobs: torch.Tensor
    ref_logprobs: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None


@dataclass
class Advantages:
    """advantages: [N,1] (one per sequence) or [N,R]; returns: [N,R] critic targets (critic algorithms only)."""

    advantages: torch.Tensor
    returns: Optional[torch.Tensor] = None


# PPO is this engine's extension; its defaults differ from the GRPO family's (a constant LR included).
PPO_DEFAULTS = {"weight_decay": 0.0, "normalize_advantages": True, "lr_scheduler": "constant"}


@register("advantage", "grpo", spec=AlgorithmSpec(min_group_size=2))
def grpo(inputs: AdvantageInputs, params: Any) -> Advantages:
    return Advantages(group_advantage(inputs.rewards, inputs.group_size, "grpo").unsqueeze(1))


@register("advantage", "dapo", spec=AlgorithmSpec(min_group_size=2))
def dapo(inputs: AdvantageInputs, params: Any) -> Advantages:
    return Advantages(group_advantage(inputs.rewards, inputs.group_size, "dapo").unsqueeze(1))


@register("advantage", "rloo", spec=AlgorithmSpec(min_group_size=2))
def rloo(inputs: AdvantageInputs, params: Any) -> Advantages:
    return Advantages(group_advantage(inputs.rewards, inputs.group_size, "rloo").unsqueeze(1))


@register("advantage", "reinforce_ppb", spec=AlgorithmSpec(kl_in_loss=False))
def reinforce_ppb(inputs: AdvantageInputs, params: Any) -> Advantages:
    from coati_relay.training.distributed import all_reduce_sum

    advantages = group_advantage(inputs.rewards, inputs.group_size, "reinforce_pp").unsqueeze(1)
    kl = None
    if inputs.ref_logprobs is not None:
        kl = kl_estimate(inputs.logprobs, inputs.ref_logprobs, kind=params.kl_estimator)
    return Advantages(kl_folded_advantages(advantages, kl, inputs.mask, params.beta, all_reduce=all_reduce_sum))


@register("advantage", "ppo", spec=AlgorithmSpec(needs_critic=True, kl_weight_key="kl_coef", kl_in_loss=False,
                                                 defaults=PPO_DEFAULTS))
def ppo(inputs: AdvantageInputs, params: Any) -> Advantages:
    if inputs.values is None:
        raise ValueError("the ppo estimator needs the critic's values (AdvantageInputs.values)")
    ref = inputs.ref_logprobs if inputs.ref_logprobs is not None else inputs.logprobs
    token_rewards = token_level_rewards(inputs.rewards, inputs.logprobs, ref, inputs.mask, params.kl_coef)
    advantages, returns = gae(token_rewards, inputs.values, inputs.mask, gamma=params.gamma, lam=params.lam)
    if params.normalize_advantages:
        advantages = whiten(advantages, inputs.mask) * inputs.mask
    return Advantages(advantages, returns)
