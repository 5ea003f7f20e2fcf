"""Legacy ``coati.models.loss``: ``PolicyLoss`` and ``ValueLoss`` as used by the Ray PPO trainer.

Both are thin modules over ``coati_relay.algorithms.policy_loss`` / ``value_loss`` with the legacy settings:
sample-level aggregation, a symmetric clip, no KL term, and a value loss that ignores its mask.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from coati_compat.deprecations import deprecated_api
from coati_relay.algorithms import policy_loss, value_loss


@deprecated_api("coati.models.loss.PolicyLoss")
class PolicyLoss(nn.Module):
    """Clipped surrogate loss: ``-min(ratio*A, clamp(ratio, 1-eps, 1+eps)*A)``, masked mean over actions, mean
    over the batch."""

    def __init__(self, clip_eps: float = 0.2) -> None:
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                action_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """log_probs, old_log_probs: [B,A]; advantages: [B,1] (or [B], [B,A]); action_mask: [B,A]. -> scalar."""
        loss, _ = policy_loss(log_probs, old_log_probs, advantages, action_mask, clip_eps_low=self.clip_eps)
        return loss


@deprecated_api("coati.models.loss.ValueLoss")
class ValueLoss(nn.Module):
    """Clipped value loss ``0.5 * mean(max((v_clip - R)^2, (v - R)^2))``; ``action_mask`` is accepted and ignored,
    as in the legacy code."""

    def __init__(self, clip_eps: float = 0.4) -> None:
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, values: torch.Tensor, old_values: torch.Tensor, reward: torch.Tensor,
                action_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """values, old_values, reward: [B] (the KL-shaped reward is the return). -> scalar."""
        return value_loss(values, old_values, reward, clip_eps=self.clip_eps)
