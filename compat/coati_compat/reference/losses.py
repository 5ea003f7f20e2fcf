"""Reference legacy losses (``coati.models.loss`` of the reference version), written from legacy_spec §A.4.

Independent of the engine: nothing here imports ``coati_relay`` or the shims.
"""
from __future__ import annotations

from typing import Optional

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``sum(x*m, dim) / (sum(m, dim) + 1e-8)``. x, mask: [B,A]. Returns [B] for dim=1."""
    m = mask.to(x.dtype)
    return torch.sum(x * m, dim=dim) / (torch.sum(m, dim=dim) + 1e-8)


def policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                action_mask: Optional[torch.Tensor] = None, clip_eps: float = 0.2) -> torch.Tensor:
    """Legacy ``PolicyLoss``. log_probs, old_log_probs: [B,A]; advantages: [B,1]; action_mask: [B,A]. -> scalar.

    ratio = exp(logp - old_logp); loss = -min(ratio*A, clamp(ratio, 1-eps, 1+eps)*A); masked mean over actions when
    a mask is given; then the mean of everything left.
    """
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, min=1.0 - clip_eps, max=1.0 + clip_eps) * advantages
    loss = -torch.minimum(unclipped, clipped)
    if action_mask is not None:
        loss = masked_mean(loss, action_mask, dim=1)
    return loss.mean()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, reward: torch.Tensor,
               action_mask: Optional[torch.Tensor] = None, clip_eps: float = 0.4) -> torch.Tensor:
    """Legacy ``ValueLoss``. values, old_values, reward: [B]. The mask is ignored, as in the legacy code. -> scalar.

    v_clip = old + clamp(v - old, -eps, eps); loss = 0.5 * mean(max((v_clip - R)^2, (v - R)^2)).
    """
    v_clipped = old_values + torch.clamp(values - old_values, min=-clip_eps, max=clip_eps)
    return 0.5 * torch.maximum((v_clipped - reward) ** 2, (values - reward) ** 2).mean()


def gpt_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Legacy ``GPTLMLoss``: mean cross-entropy of logits[:, t] against labels[:, t+1]. logits [B,S,V]. -> scalar."""
    log_probs = torch.log_softmax(logits[:, :-1, :].float(), dim=-1)
    picked = log_probs.gather(-1, labels[:, 1:].unsqueeze(-1)).squeeze(-1)
    return -picked.mean()


def ppo_ptx_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                 lm_logits: torch.Tensor, lm_input_ids: torch.Tensor, action_mask: Optional[torch.Tensor] = None,
                 clip_eps: float = 0.2, pretrain_coef: float = 0.0) -> torch.Tensor:
    """Legacy ``PPOPtxActorLoss``: policy loss + pretrain_coef * GPT LM loss. -> scalar."""
    return (policy_loss(log_probs, old_log_probs, advantages, action_mask, clip_eps)
            + pretrain_coef * gpt_lm_loss(lm_logits, lm_input_ids))


def log_sig_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Legacy ``LogSigLoss``: -mean(log sigmoid(chosen - rejected)). chosen, rejected: [B]. -> scalar."""
    return -torch.log(1.0 / (1.0 + torch.exp(rejected - chosen))).mean()


def log_exp_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Legacy ``LogExpLoss``: mean(log(1 + exp(rejected - chosen))). chosen, rejected: [B]. -> scalar."""
    return torch.log1p(torch.exp(rejected - chosen)).mean()


def normalize(x: torch.Tensor, dim: int = 0, eps: float = 1e-8) -> torch.Tensor:
    """Legacy ``normalize``: centre along ``dim`` and divide by sqrt(max(population variance, eps))."""
    centred = x - x.mean(dim)
    return centred / torch.sqrt(torch.clamp((centred * centred).mean(dim), min=eps))


def masked_normalize(x: torch.Tensor, mask: torch.Tensor, dim: int = 1, eps: float = 1e-8) -> torch.Tensor:
    """Legacy ``masked_normalize``: the masked input centred by its masked mean along ``dim`` and scaled by
    1/sqrt(max(masked variance, eps)); the [B] statistics broadcast against the last dimension, as they did."""
    xm = x * mask
    mean = masked_mean(xm, mask, dim)
    centred = xm - mean
    var = masked_mean(centred * centred, mask, dim)
    return centred / torch.sqrt(torch.clamp(var, min=eps))
