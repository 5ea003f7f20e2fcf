"""Advantage arithmetic the estimators of `coati_relay.algorithms.estimators` are made of.

- `group_advantage`: group-relative baselines over the G responses of each prompt (grpo, dapo, rloo,
  reinforce_pp / reinforce_ppb), computed on the raw reward.
- `gae`: generalised advantage estimation over per-token rewards and values (PPO with a critic).
- `kl_folded_advantages`: REINFORCE++'s KL penalty folded into the advantages, whitened over the global batch.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from coati_relay.algorithms.masked import whiten_over_ranks

GROUP_ALGOS = ("grpo", "dapo", "rloo", "reinforce_pp", "reinforce_ppb")


def group_advantage(rewards: torch.Tensor, group_size: int, algo: str, eps: float = 1e-4) -> torch.Tensor:
    """Group-relative advantages. rewards: [N] prompt-major (rows i*G..i*G+G-1 answer prompt i). Returns [N].

    With mu_g and std_g the mean and unbiased standard deviation of the G rewards of a group:
      grpo, dapo:   (r - mu_g) / (std_g + eps)
      rloo:         (r - mu_g) * G / (G - 1)      (= r minus the mean of the other G - 1 rewards)
      reinforce_pp: r - mu_g                      (alias reinforce_ppb)
    G < 2 raises for grpo, dapo and rloo (their baseline is undefined for one sample).
    """
    key = algo.lower() if isinstance(algo, str) else algo
    if key not in GROUP_ALGOS:
        raise ValueError(f"group_advantage: unknown algo {algo!r}; use one of {list(GROUP_ALGOS)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_advantage: group_size must be a positive int, got {group_size!r}")
    if group_size < 2 and key in ("grpo", "dapo", "rloo"):
        raise ValueError(f"{algo} needs group_size >= 2 (several responses per prompt), got {group_size}; "
                         "raise num_generations or use 'reinforce_pp'")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"group_advantage needs rewards of shape [N] with N a multiple of group_size="
                         f"{group_size}; got {tuple(rewards.shape)}")
    r = rewards.reshape(-1, group_size)
    r = r if r.is_floating_point() else r.float()
    centred = r - r.mean(dim=1, keepdim=True)
    if key in ("grpo", "dapo"):
        adv = centred / (r.std(dim=1, unbiased=True, keepdim=True) + eps)
    elif key == "rloo":
        adv = centred * (group_size / (group_size - 1))
    else:
        adv = centred
    return adv.reshape(-1)


def kl_folded_advantages(advantages: torch.Tensor, per_token_kl: Optional[torch.Tensor], mask: torch.Tensor,
                         beta: float, all_reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                         ) -> torch.Tensor:
    """REINFORCE++ (baseline) advantages: ``whiten(A - beta * kl, mask)``, ``whiten(A, mask)`` without a KL, with
    the mean and variance of the global batch: ``all_reduce`` sums the statistics over the data-parallel ranks
    (`whiten_over_ranks`; None: this batch alone).

    advantages: [B,1] or [B,T]; per_token_kl, mask: [B,T]. Returns [B,T], 0 on masked positions. The KL term is
    then left out of the loss (pass ``beta=0`` to ``policy_loss``).
    """
    if per_token_kl is not None:
        if per_token_kl.shape != mask.shape:
            raise ValueError(f"per_token_kl {tuple(per_token_kl.shape)} and mask {tuple(mask.shape)} must match")
        advantages = advantages - beta * per_token_kl
    return whiten_over_ranks(advantages, mask, all_reduce or (lambda stats: stats))


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> Tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation. token_rewards, values, mask: [B,T]. Returns (advantages, returns), [B,T].

    Over the valid positions of a row (t' is the next valid position after t; past the last one V = 0):
      delta_t = r_t + gamma * V_t' - V_t
      A_t     = delta_t + gamma * lam * A_t'
      R_t     = A_t + V_t
    Masked positions are skipped (they neither end nor discount the chain) and get A = R = 0. Values are detached; the
    recursion runs backwards over T, vectorised over the batch.
    """
    if not (token_rewards.shape == values.shape == mask.shape) or token_rewards.dim() != 2:
        raise ValueError(f"gae needs token_rewards, values and mask of one shape [B,T]; got "
                         f"{tuple(token_rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)}")
    m = mask.to(values.dtype)
    r = token_rewards.to(values.dtype) * m
    v = values.detach() * m
    next_value = torch.zeros_like(v[:, 0])
    next_adv = torch.zeros_like(v[:, 0])
    advantages = torch.zeros_like(v)
    for t in reversed(range(v.size(1))):
        delta = r[:, t] + gamma * next_value - v[:, t]
        adv_t = delta + gamma * lam * next_adv
        valid = m[:, t]
        advantages[:, t] = adv_t * valid
        next_adv = valid * adv_t + (1 - valid) * next_adv
        next_value = valid * v[:, t] + (1 - valid) * next_value
    return advantages, (advantages + v) * m
