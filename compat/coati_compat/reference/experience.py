"""Reference legacy experience step (legacy_spec §A.5, steps 2-7) and the legacy batching of experience (§A.1).

Experience is a plain dict of tensors keyed by the legacy field names (``FIELDS``). Models are passed as plain
torch modules: Hugging Face causal LMs for the actor and the initial model, transformer bodies plus value heads for
the critic and the reward model. Nothing here imports ``coati_relay`` or the shims.

KL direction: ColossalAI #4338 (2023-08, in the final legacy release) computes the k3 estimate with
``x = logp_base - logp``; the reference commit ``b5f056636`` used ``x = logp - logp_base``. Both are available
(``kl_direction``); the default is the final one, which the shims keep (see migration_guide/deviations.md).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from coati_compat.reference.losses import masked_mean

FIELDS = ("sequences", "action_log_probs", "values", "reward", "advantages", "attention_mask", "action_mask")
LEFT_PADDED = ("action_log_probs", "action_mask")
KL_DIRECTIONS = ("base_minus_actor", "actor_minus_base")

Batch = Dict[str, Optional[torch.Tensor]]


def approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, action_mask: Optional[torch.Tensor] = None,
              kl_direction: str = "base_minus_actor") -> torch.Tensor:
    """Per-sequence k3 estimate ``exp(x) - 1 - x``, averaged over the (masked) actions. [B,A] inputs -> [B]."""
    if kl_direction not in KL_DIRECTIONS:
        raise ValueError(f"kl_direction must be one of {KL_DIRECTIONS}, got {kl_direction!r}")
    x = log_probs_base - log_probs if kl_direction == "base_minus_actor" else log_probs - log_probs_base
    k3 = (x.exp() - 1) - x
    return k3.mean(dim=1) if action_mask is None else masked_mean(k3, action_mask, dim=1)


def kl_shaped_reward(r: torch.Tensor, kl_coef: float, log_probs: torch.Tensor, log_probs_base: torch.Tensor,
                     action_mask: Optional[torch.Tensor] = None,
                     kl_direction: str = "base_minus_actor") -> torch.Tensor:
    """``r - kl_coef * approx_kl`` ([B]); ``kl_coef <= 0`` gives ``r``."""
    if kl_coef <= 0.0:
        return r
    return r - kl_coef * approx_kl(log_probs, log_probs_base, action_mask, kl_direction)


def advantage(reward: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``reward - value`` as [B,1]. reward, value: [B]."""
    adv = reward - value
    return adv.unsqueeze(-1) if adv.dim() == 1 else adv


def attention_mask_of(sequences: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """LongTensor [B,S]: 1 where the token is not the pad id (EOS included when pad == eos, masked out too)."""
    return (sequences != pad_token_id).long()


def action_mask_of(sequences: torch.Tensor, input_len: int, eos_token_id: Optional[int]) -> torch.Tensor:
    """BoolTensor [B, S-input_len]: True on generated tokens up to and including the first EOS."""
    generated = sequences[:, input_len:]
    if eos_token_id is None:
        return torch.ones_like(generated, dtype=torch.bool)
    seen_before = F.pad((generated == eos_token_id).long().cumsum(dim=1)[:, :-1], (1, 0), value=0)
    return seen_before == 0


def action_log_probs(causal_lm: nn.Module, sequences: torch.Tensor, num_actions: int,
                     attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Log-probs [B,num_actions] of the last num_actions tokens under a HF causal LM; the legacy slice
    ``[:, -num_actions:]`` of the S-1 log-probs, so ``num_actions >= S`` gives all S-1."""
    logits = causal_lm(input_ids=sequences, attention_mask=attention_mask).logits
    log_probs = torch.log_softmax(logits[:, :-1, :], dim=-1)
    picked = torch.gather(log_probs, 2, sequences[:, 1:, None])[..., 0]
    return picked[:, -num_actions:]


def critic_value(body: nn.Module, value_head: nn.Module, sequences: torch.Tensor,
                 action_mask: Optional[torch.Tensor], attention_mask: Optional[torch.Tensor],
                 use_action_mask: bool = True) -> torch.Tensor:
    """Reference-version critic, [B]: with ``use_action_mask`` and a mask, the mean value over the prompt tokens
    (weighted by attention_mask); otherwise the mean over every position but the last."""
    hidden = body(input_ids=sequences, attention_mask=attention_mask).last_hidden_state
    values = value_head(hidden)[..., 0]
    if use_action_mask and action_mask is not None:
        prompt_len = sequences.size(1) - action_mask.size(1)
        weights = torch.ones_like(values) if attention_mask is None else attention_mask.to(values.dtype)
        return masked_mean(values[:, :prompt_len], weights[:, :prompt_len], dim=1)
    return values[:, :-1].mean(dim=1)


def reward_model_score(body: nn.Module, value_head: nn.Module, sequences: torch.Tensor,
                       attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Reference-version reward model, [B]: the mean value over every position but the last."""
    hidden = body(input_ids=sequences, attention_mask=attention_mask).last_hidden_state
    return value_head(hidden)[:, :-1, 0].mean(dim=1)


@torch.no_grad()
def experience_from_sequences(actor: nn.Module, initial_model: nn.Module, critic_body: nn.Module,
                              critic_head: nn.Module, rm_body: nn.Module, rm_head: nn.Module,
                              sequences: torch.Tensor, input_len: int, pad_token_id: int,
                              eos_token_id: Optional[int], kl_coef: float = 0.1,
                              kl_direction: str = "base_minus_actor") -> Batch:
    """Steps 2-7 of the legacy maker for sampled ``sequences`` [B,S] whose first ``input_len`` columns are the
    prompt. Returns the experience dict (see ``FIELDS``)."""
    attention_mask = attention_mask_of(sequences, pad_token_id)
    action_mask = action_mask_of(sequences, input_len, eos_token_id)
    num_actions = action_mask.size(1)
    logp = action_log_probs(actor, sequences, num_actions, attention_mask)
    logp_base = action_log_probs(initial_model, sequences, num_actions, attention_mask)
    value = critic_value(critic_body, critic_head, sequences, action_mask, attention_mask)
    r = reward_model_score(rm_body, rm_head, sequences, attention_mask)
    reward = kl_shaped_reward(r, kl_coef, logp, logp_base, action_mask, kl_direction)
    return {"sequences": sequences, "action_log_probs": logp, "values": value, "reward": reward,
            "advantages": advantage(reward, value), "attention_mask": attention_mask, "action_mask": action_mask}


def split_batch(batch: Batch) -> List[Batch]:
    """One dict per sample (row i of every field; None stays None)."""
    size = batch["sequences"].shape[0]
    return [{k: (None if batch[k] is None else batch[k][i]) for k in FIELDS} for i in range(size)]


def _left_zero_pad(rows: List[torch.Tensor]) -> torch.Tensor:
    """Stacks 1-D tensors right-aligned in a zero tensor [N, longest]."""
    lengths = torch.tensor([r.shape[0] for r in rows])
    width = int(lengths.max())
    out = torch.zeros(len(rows), width, dtype=rows[0].dtype, device=rows[0].device)
    keep = torch.arange(width).unsqueeze(0) >= (width - lengths).unsqueeze(1)
    out[keep] = torch.cat(rows)
    return out


def merge_items(items: List[Batch]) -> Batch:
    """The legacy ``make_experience_batch``: log-probs and action mask left-padded with zeros, the rest stacked
    (``torch.stack`` raises for different sequence lengths, as in the legacy code)."""
    merged: Batch = {}
    for key in FIELDS:
        column = [item[key] for item in items]
        if all(v is None for v in column):
            merged[key] = None
        elif key in LEFT_PADDED:
            merged[key] = _left_zero_pad(column)
        else:
            merged[key] = torch.stack(column, dim=0)
    return merged
