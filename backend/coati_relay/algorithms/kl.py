"""KL estimators (registered under kind ``"kl"``) and per-token KL rewards.

With ``x = ref_logp - logp`` per token (samples drawn from the current policy pi, reference pi_ref):
  k1 = -x                 unbiased, high variance, can be negative
  k2 = x^2 / 2            biased, low variance
  k3 = exp(x) - 1 - x     unbiased, non-negative (ColossalChat's estimator)
No clamping is applied.
"""
from __future__ import annotations

import torch

from coati_relay.algorithms.registry import get, register


def _log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} must have one shape")
    return ref_logp - logp


@register("kl", "k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``k1 = logp - ref_logp``. logp, ref_logp: [B,T]. Returns [B,T]."""
    return -_log_ratio(logp, ref_logp)


@register("kl", "k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``k2 = (ref_logp - logp)^2 / 2``. logp, ref_logp: [B,T]. Returns [B,T]."""
    return _log_ratio(logp, ref_logp) ** 2 / 2


@register("kl", "k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``k3 = exp(x) - 1 - x`` with ``x = ref_logp - logp``. logp, ref_logp: [B,T]. Returns [B,T]."""
    x = _log_ratio(logp, ref_logp)
    return x.exp() - 1 - x


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate of ``kind`` (k1, k2, k3). logp, ref_logp: [B,T]. Returns [B,T]."""
    return get("kl", kind)(logp, ref_logp)


def token_level_rewards(r: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                        kl_coef: float) -> torch.Tensor:
    """Per-token rewards for GAE: ``-kl_coef * k1`` on every valid token, plus ``r`` on each row's last valid token.

    r: [B]; logp, ref_logp, mask: [B,T]. Returns [B,T], 0 on masked positions. Every row needs a valid token.
    """
    if r.dim() != 1 or mask.dim() != 2 or mask.size(0) != r.size(0) or mask.shape != logp.shape:
        raise ValueError(f"token_level_rewards needs r [B] and logp, ref_logp, mask [B,T]; got r "
                         f"{tuple(r.shape)}, logp {tuple(logp.shape)}, mask {tuple(mask.shape)}")
    valid = mask.bool()
    empty = (~valid.any(dim=1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(f"token_level_rewards: rows {empty.tolist()} have no valid token to carry the reward")
    rewards = torch.where(valid, -kl_coef * kl_k1(logp, ref_logp), torch.zeros_like(logp))
    positions = torch.arange(mask.size(1), device=mask.device).expand_as(valid)
    last = torch.where(valid, positions, -1).argmax(dim=1, keepdim=True)
    return rewards.scatter_add(1, last, r.to(rewards.dtype).unsqueeze(1))
