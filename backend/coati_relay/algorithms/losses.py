"""Policy and value losses, registered under kinds ``"policy_loss"`` (``ppo_clip``) and ``"value_loss"``
(``clipped``): the defaults of ``grpo_config["policy_loss"]`` and ``["value_loss"]``. A user's own has the same
signature (see `coati_relay.algorithms.registry`) and is registered with ``@register("policy_loss", "name")``."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from coati_relay.algorithms.masked import masked_mean, masked_sum
from coati_relay.algorithms.registry import register

AGGREGATIONS = ("sample_level", "token_level")
# Bound on |logp - old_logp| before the exp: an inf there (a -inf behaviour log-prob of a sample the loss mask
# drops) would give inf * 0 = NaN in the loss, and the gradient all-reduce would carry it to every rank.
LOG_RATIO_LIMIT = 20.0


def _check_policy_inputs(logp, old_logp, advantages, mask, per_token_kl, beta, loss_mask, aggregation,
                         clip_eps_low, clip_eps_high) -> None:
    if logp.dim() != 2 or logp.shape != old_logp.shape:
        raise ValueError(f"policy_loss needs logp and old_logp of one shape [B,T]; got {tuple(logp.shape)} and "
                         f"{tuple(old_logp.shape)}")
    b, t = logp.shape
    if mask is not None and mask.shape != logp.shape:
        raise ValueError(f"policy_loss: mask {tuple(mask.shape)} must have logp's shape {(b, t)}")
    if advantages.shape not in ((b,), (b, 1), (b, t)):
        raise ValueError(f"policy_loss: advantages must be [B], [B,1] or [B,T] with B={b}, T={t}; "
                         f"got {tuple(advantages.shape)}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"policy_loss: aggregation must be one of {list(AGGREGATIONS)}, got {aggregation!r}")
    if clip_eps_low < 0 or clip_eps_high < 0:
        raise ValueError(f"policy_loss: clip epsilons must be >= 0, got low={clip_eps_low}, high={clip_eps_high}")
    if beta > 0 and per_token_kl is None:
        raise ValueError("policy_loss: beta > 0 needs per_token_kl [B,T] (see kl_estimate); or set beta=0")
    if per_token_kl is not None and per_token_kl.shape != logp.shape:
        raise ValueError(f"policy_loss: per_token_kl {tuple(per_token_kl.shape)} must have logp's shape {(b, t)}")
    if loss_mask is not None and loss_mask.shape != (b,):
        raise ValueError(f"policy_loss: loss_mask must be [B] with B={b}, got {tuple(loss_mask.shape)}")


@register("policy_loss", "ppo_clip")
def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: Optional[torch.Tensor], clip_eps_low: float = 0.2, clip_eps_high: Optional[float] = None,
                aggregation: str = "sample_level", per_token_kl: Optional[torch.Tensor] = None, beta: float = 0.0,
                loss_mask: Optional[torch.Tensor] = None, total_tokens: Optional[torch.Tensor | float] = None,
                num_samples: Optional[torch.Tensor | float] = None,
                stats_on_host: bool = True) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Clipped surrogate policy loss with an asymmetric clip and an optional per-token KL term.

    logp, old_logp: [B,T] current and behaviour log-probs; advantages: [B], [B,1] or [B,T] (broadcast over T);
    mask: [B,T] valid actions (None: all); per_token_kl: [B,T]; loss_mask: [B] samples kept (None: all).
      ratio  = exp(clamp(logp - old_logp, -20, 20))              (1 on masked positions)
      l_t    = -min(ratio * A, clamp(ratio, 1 - eps_low, 1 + eps_high) * A) + beta * kl_t
      sample_level: sum_b( loss_mask_b * sum_t(l_t m_t) / (sum_t m_t + 1e-8) ) / num_samples
      token_level:  sum_b( loss_mask_b * sum_t(l_t m_t) ) / (total_tokens + 1e-8)
    ``num_samples`` defaults to B (the mean over this micro-batch, kept or not, as ColossalChat's loss);
    ``total_tokens`` to the valid tokens of the kept samples. Where a batch is split over micro-batches or
    data-parallel ranks, pass the counts of the whole batch (kept samples, kept valid tokens), so that the
    micro-batch losses sum to the loss of the whole batch.
    ``clip_eps_high=None`` means ``eps_low``. With sample_level, eps 0.2, beta 0 and no loss_mask this is the legacy
    ``PolicyLoss``. Returns (scalar loss, stats) with stats ``loss``, ``clip_frac`` (fraction of valid tokens where
    the clipped term is the minimum), ``ratio_max``, ``ratio_mean``, ``approx_kl`` (masked mean of the k3 estimate of
    KL(pi || pi_old)) and, with per_token_kl, ``kl``: floats, or with ``stats_on_host=False`` 0-dim float32 tensors
    on logp's device (no host sync: a training loop reads them once per step).
    """
    clip_eps_high = clip_eps_low if clip_eps_high is None else clip_eps_high
    _check_policy_inputs(logp, old_logp, advantages, mask, per_token_kl, beta, loss_mask, aggregation,
                         clip_eps_low, clip_eps_high)
    m = torch.ones_like(logp) if mask is None else mask.to(logp.dtype)
    valid = m.bool()
    adv = advantages.detach()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    log_ratio = torch.where(valid, (logp - old_logp.detach()).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT),
                            torch.zeros_like(logp))
    ratio = log_ratio.exp()
    surr1 = ratio * adv
    surr2 = ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv
    per_token = -torch.min(surr1, surr2)
    if beta > 0:
        per_token = per_token + beta * per_token_kl
    if aggregation == "sample_level":
        per_sample = masked_mean(per_token, m, dim=1)
        if loss_mask is not None:
            per_sample = per_sample * loss_mask.to(per_sample.dtype)
        loss = per_sample.mean() if num_samples is None else per_sample.sum() / num_samples
    else:
        kept = m if loss_mask is None else m * loss_mask.to(m.dtype).unsqueeze(1)
        total = kept.sum() if total_tokens is None else total_tokens
        loss = masked_sum(per_token, kept, dim=1).sum() / (total + 1e-8)
    with torch.no_grad():
        named = {
            "loss": loss.detach(),
            "clip_frac": masked_mean((surr2 < surr1).to(m.dtype), m),
            "ratio_max": torch.where(valid, ratio, torch.full_like(ratio, float("-inf"))).max(),
            "ratio_mean": masked_mean(ratio, m),
            "approx_kl": masked_mean((-log_ratio).exp() - 1 + log_ratio, m),
        }
        if per_token_kl is not None:
            named["kl"] = masked_mean(per_token_kl, m)
        if not stats_on_host:
            return loss, {k: v.float() for k, v in named.items()}
        values = torch.stack([v.float() for v in named.values()]).tolist()
    return loss, dict(zip(named, values))


@register("value_loss", "clipped")
def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_eps: float = 0.4,
               mask: Optional[torch.Tensor] = None,
               total_tokens: Optional[torch.Tensor | float] = None) -> torch.Tensor:
    """Clipped value loss (the legacy ``ValueLoss``). values, old_values, returns: [B] or [B,T]; mask: same shape.

      v_clip = old + clamp(v - old, -eps, eps)
      loss   = 0.5 * mean(max((v_clip - R)^2, (v - R)^2))
    ``mask=None`` takes the plain mean (the legacy code ignored its mask), otherwise the masked mean over all
    valid entries; with ``total_tokens`` (the valid entries of the whole batch, when this is a micro-batch of it)
    the masked sum divided by it. Returns a scalar.
    """
    if not (values.shape == old_values.shape == returns.shape):
        raise ValueError(f"value_loss needs values, old_values and returns of one shape; got {tuple(values.shape)}, "
                         f"{tuple(old_values.shape)}, {tuple(returns.shape)}")
    if mask is not None and mask.shape != values.shape:
        raise ValueError(f"value_loss: mask {tuple(mask.shape)} must have values' shape {tuple(values.shape)}")
    if clip_eps < 0:
        raise ValueError(f"value_loss: clip_eps must be >= 0, got {clip_eps}")
    old_values, returns = old_values.detach(), returns.detach()
    v_clip = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    loss = torch.max((v_clip - returns) ** 2, (values - returns) ** 2)
    if total_tokens is not None:
        if mask is None:
            raise ValueError("value_loss: total_tokens divides the masked sum; pass the mask too")
        return 0.5 * masked_sum(loss, mask) / total_tokens
    return 0.5 * (loss.mean() if mask is None else masked_mean(loss, mask))
