"""Legacy ``coati.models.utils``: log-probs of actions, masked mean, KL estimate and KL-shaped reward.

The formulas come from ``coati_relay.algorithms``, so the legacy maker and the engine share one implementation.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from coati_compat.deprecations import deprecated_api
from coati_relay.algorithms import kl_k3, legacy_kl_shaped_reward
from coati_relay.algorithms import masked_mean as _masked_mean


@deprecated_api("coati.models.utils.masked_mean")
def masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``sum(x * m, dim) / (sum(m, dim) + 1e-8)``. tensor, mask: [B,A]. Returns [B] for dim=1."""
    return _masked_mean(tensor, mask, dim=dim)


@deprecated_api("coati.models.utils.compute_approx_kl")
def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor,
                      action_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-sequence k3 KL estimate, averaged over the (masked) actions. log_probs, log_probs_base: [B,A]. -> [B]."""
    k3 = kl_k3(log_probs, log_probs_base)
    return k3.mean(dim=1) if action_mask is None else _masked_mean(k3, action_mask, dim=1)


@deprecated_api("coati.models.utils.compute_reward")
def compute_reward(r: torch.Tensor, kl_coef: float, log_probs: torch.Tensor, log_probs_base: torch.Tensor,
                   action_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``r - kl_coef * compute_approx_kl(...)``; ``kl_coef <= 0`` returns r. r: [B]; log-probs: [B,A]. -> [B]."""
    return legacy_kl_shaped_reward(r, log_probs, log_probs_base, action_mask, kl_coef)


@deprecated_api("coati.models.utils.log_probs_from_logits")
def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)`` gathered at ``labels``. logits: [B,S,V], labels: [B,S]. Returns [B,S]."""
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"expected logits [B,S,V] and labels [B,S]; got {tuple(logits.shape)} and "
                         f"{tuple(labels.shape)}")
    return F.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def action_log_probs(logits: torch.Tensor, sequences: torch.Tensor, num_actions: int) -> torch.Tensor:
    """Log-probs of the last ``num_actions`` tokens of ``sequences`` under ``logits``.

    logits: [B,S,V] (position t predicts token t+1), sequences: [B,S]. Returns [B,num_actions].
    """
    if not isinstance(num_actions, int) or not 0 < num_actions < sequences.size(1):
        raise ValueError(f"num_actions must be an int in [1, {sequences.size(1) - 1}] for sequences of length "
                         f"{sequences.size(1)}; got {num_actions!r}")
    return log_probs_from_logits(logits[:, :-1, :], sequences[:, 1:])[:, -num_actions:]


@deprecated_api("coati.models.utils.calc_action_log_probs")
def calc_action_log_probs(output: Any, sequences: torch.Tensor, num_actions: int) -> torch.Tensor:
    """Legacy form of :func:`action_log_probs` taking a model output (``output["logits"]``: [B,S,V])."""
    return action_log_probs(output["logits"], sequences, num_actions)
