"""Legacy ``coati.models.loss``: ``PolicyLoss`` and ``ValueLoss`` as used by the Ray PPO trainer, and the other
losses of the module (``GPTLMLoss``, ``PPOPtxActorLoss``, the pairwise reward-model losses).

``PolicyLoss`` and ``ValueLoss`` are thin modules over ``coati_relay.algorithms.policy_loss`` / ``value_loss`` with
the legacy settings: sample-level aggregation, a symmetric clip, no KL term, and a value loss that ignores its mask.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from coati_compat.imports.deprecations import deprecated_api
from coati_relay.parts import policy_loss, value_loss


@deprecated_api("coati.models.loss.PolicyLoss")
class PolicyLoss(nn.Module):
    """Clipped surrogate loss: ``-min(ratio*A, clamp(ratio, 1-eps, 1+eps)*A)``, masked mean over actions, mean
    over the batch."""

    def __init__(self, clip_eps: float = 0.2) -> None:
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                action_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """log_probs, old_log_probs: [B,A]; advantages: [B,1] (or [B], [B,A]); action_mask: [B,A]. -> scalar.

        One log-prob per sample (log_probs, old_log_probs and advantages all [B], no mask) is the mean of the
        per-sample loss, as in both legacy releases."""
        if log_probs.dim() == 1:
            if action_mask is not None or not (log_probs.shape == old_log_probs.shape == advantages.shape):
                raise ValueError(f"PolicyLoss with one log-prob per sample needs log_probs, old_log_probs and "
                                 f"advantages all [B] and no action_mask; got {tuple(log_probs.shape)}, "
                                 f"{tuple(old_log_probs.shape)}, {tuple(advantages.shape)}, mask "
                                 f"{None if action_mask is None else tuple(action_mask.shape)}")
            log_probs, old_log_probs, advantages = log_probs[:, None], old_log_probs[:, None], advantages[:, None]
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


@deprecated_api("coati.models.loss.GPTLMLoss")
class GPTLMLoss(nn.Module):
    """Next-token cross-entropy: position t of ``logits`` predicts token t+1 of ``labels``, averaged over every
    position (no ignore mask beyond cross-entropy's default ``ignore_index=-100``)."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = nn.CrossEntropyLoss()

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """logits: [B,S,V]; labels: [B,S]. -> scalar."""
        predicted = logits[..., :-1, :].reshape(-1, logits.size(-1))
        return self.loss(predicted, labels[..., 1:].reshape(-1))


@deprecated_api("coati.models.loss.PPOPtxActorLoss")
class PPOPtxActorLoss(nn.Module):
    """PPO-ptx: the clipped policy loss plus ``pretrain_coef`` times a language-model loss on pre-training data."""

    def __init__(self, policy_clip_eps: float = 0.2, pretrain_coef: float = 0.0,
                 pretrain_loss_fn: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.pretrain_coef = pretrain_coef
        self.policy_loss_fn = PolicyLoss(clip_eps=policy_clip_eps)
        self.pretrain_loss_fn = pretrain_loss_fn if pretrain_loss_fn is not None else GPTLMLoss()

    def forward(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                lm_logits: torch.Tensor, lm_input_ids: torch.Tensor,
                action_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """log-probs: [B,A]; advantages: [B,1]; lm_logits: [B',S,V]; lm_input_ids: [B',S]. -> scalar."""
        policy = self.policy_loss_fn(log_probs, old_log_probs, advantages, action_mask=action_mask)
        return policy + self.pretrain_coef * self.pretrain_loss_fn(lm_logits, lm_input_ids)


@deprecated_api("coati.models.loss.LogSigLoss")
class LogSigLoss(nn.Module):
    """Pairwise reward-model loss ``-mean(log(sigmoid(chosen - rejected)))``."""

    def forward(self, chosen_reward: torch.Tensor, reject_reward: torch.Tensor) -> torch.Tensor:
        """chosen_reward, reject_reward: [B]. -> scalar."""
        return -torch.log(torch.sigmoid(chosen_reward - reject_reward)).mean()


@deprecated_api("coati.models.loss.LogExpLoss")
class LogExpLoss(nn.Module):
    """Pairwise reward-model loss ``mean(log(1 + exp(rejected - chosen)))``."""

    def forward(self, chosen_reward: torch.Tensor, reject_reward: torch.Tensor) -> torch.Tensor:
        """chosen_reward, reject_reward: [B]. -> scalar."""
        return torch.log(1 + torch.exp(reject_reward - chosen_reward)).mean()
