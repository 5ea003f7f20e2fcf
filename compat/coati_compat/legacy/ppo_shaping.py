"""The legacy experience maker's reward shaping and advantage, on the engine's KL estimator and masked mean.

Used by the legacy ``NaiveExperienceMaker`` (steps 6 and 7) and by ``coati.models.utils.compute_reward``.
"""
from __future__ import annotations

from typing import Optional

import torch

from coati_relay.parts import kl_k3, masked_mean


def legacy_kl_shaped_reward(r: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor,
                            action_mask: Optional[torch.Tensor], kl_coef: float) -> torch.Tensor:
    """The legacy maker's reward: ``r - kl_coef * masked_mean(k3, action_mask, dim=1)``.

    r: [B] reward-model score; logp, ref_logp: [B,A] actor and initial-model log-probs of the actions;
    action_mask: [B,A] (None: every action counts). Returns [B]. ``kl_coef <= 0`` returns ``r`` unchanged.
    """
    if r.dim() != 1 or logp.dim() != 2 or logp.size(0) != r.size(0):
        raise ValueError(f"legacy_kl_shaped_reward needs r [B] and logp [B,A]; got {tuple(r.shape)} and "
                         f"{tuple(logp.shape)}")
    if kl_coef <= 0:
        return r
    return r - kl_coef * legacy_sequence_kl(logp, ref_logp, action_mask)


def legacy_sequence_kl(logp: torch.Tensor, ref_logp: torch.Tensor,
                       action_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The legacy per-sequence KL: the engine's k3 estimate, averaged over the (masked) actions. [B,A] -> [B]."""
    k3 = kl_k3(logp, ref_logp)
    return k3.mean(dim=1) if action_mask is None else masked_mean(k3, action_mask, dim=1)


def legacy_advantage(reward: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``A = r - V``, unsqueezed to ``[B, 1]`` so that it broadcasts over tokens (no GAE, no normalisation).

    reward: [B] (the KL-shaped reward), value: [B] (critic value per sequence). Returns [B, 1].
    """
    if reward.dim() != 1 or reward.shape != value.shape:
        raise ValueError(f"legacy_advantage needs reward and value of one shape [B]; got "
                         f"{tuple(reward.shape)} and {tuple(value.shape)}")
    return (reward - value).unsqueeze(-1)
