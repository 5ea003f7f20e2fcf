"""Legacy ``coati.models.utils``: log-probs of actions, masked mean and normalisation, KL estimate, KL-shaped
reward, and ``convert_to_lora``.

The formulas come from ``coati_relay.algorithms``, so the legacy maker and the engine share one implementation.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.ppo_shaping import legacy_kl_shaped_reward, legacy_sequence_kl
from coati_relay.parts import masked_mean as _masked_mean


@deprecated_api("coati.models.utils.masked_mean")
def masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``sum(x * m, dim) / (sum(m, dim) + 1e-8)``. tensor, mask: [B,A]. Returns [B] for dim=1."""
    return _masked_mean(tensor, mask, dim=dim)


@deprecated_api("coati.models.utils.compute_approx_kl")
def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor,
                      action_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-sequence k3 KL estimate, averaged over the (masked) actions. log_probs, log_probs_base: [B,A]. -> [B]."""
    return legacy_sequence_kl(log_probs, log_probs_base, action_mask)


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
    """Log-probs of the last ``num_actions`` tokens of ``sequences`` under ``logits``, sliced as the legacy code did.

    logits: [B,S,V] (position t predicts token t+1), sequences: [B,S]. Returns [B,min(num_actions, S-1)]: the
    first token has no log-prob, so ``num_actions >= S`` gives all S-1 of them (legacy ``[:, -num_actions:]``).
    """
    if isinstance(num_actions, bool) or not isinstance(num_actions, int) or num_actions < 1:
        raise ValueError(f"num_actions must be a positive int (the number of generated tokens at the end of the "
                         f"sequences), got {num_actions!r}")
    return log_probs_from_logits(logits[:, :-1, :], sequences[:, 1:])[:, -num_actions:]


@deprecated_api("coati.models.utils.calc_action_log_probs")
def calc_action_log_probs(logits: Any = None, sequences: Optional[torch.Tensor] = None,
                          num_actions: Optional[int] = None, *, output: Any = None) -> torch.Tensor:
    """:func:`action_log_probs` in both legacy call forms: ``(logits, sequences, num_actions)`` of the final release
    (logits [B,S,V]) and ``(output, sequences, num_actions)`` of the June 2023 one (a model output with
    ``"logits"``, positionally or as ``output=``). Returns [B,num_actions] (at most S-1 columns)."""
    if logits is not None and output is not None:
        raise TypeError("calc_action_log_probs takes the logits once: as logits (or positionally) or as output=")
    first = logits if output is None else output
    if first is None or sequences is None or num_actions is None:
        raise TypeError("calc_action_log_probs needs logits [B,S,V] (or a model output), sequences [B,S] and "
                        "num_actions")
    if not isinstance(first, torch.Tensor):
        try:
            first = first["logits"]
        except (KeyError, TypeError, IndexError) as exc:
            raise TypeError("calc_action_log_probs takes the logits [B,S,V] or a model output with 'logits'; got "
                            f"{type(first).__name__}") from exc
    return action_log_probs(first, sequences, num_actions)


@deprecated_api("coati.models.utils.masked_normalize")
def masked_normalize(tensor: torch.Tensor, mask: torch.Tensor, dim: int = 1, eps: float = 1e-8) -> torch.Tensor:
    """Whitening over the masked entries along ``dim``: ``(x*m - mean) / sqrt(max(var, eps))`` with the masked
    mean and variance, as the legacy code computed them. tensor, mask: [B,A]; returns [B,A].

    The legacy broadcast is kept: the [B] statistics of ``dim=1`` broadcast against the last dimension, which is
    only shape-correct for square inputs or ``B == 1``; other shapes raise as they did.
    """
    tensor = tensor * mask
    mean = _masked_mean(tensor, mask, dim=dim)
    centred = tensor - mean
    var = _masked_mean(centred ** 2, mask, dim=dim)
    return centred * var.clamp(min=eps).rsqrt()


@deprecated_api("coati.models.utils.normalize")
def normalize(tensor: torch.Tensor, dim: int = 0, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(max(var, eps))`` along ``dim`` (population variance). tensor: [B,...]."""
    centred = tensor - tensor.mean(dim)
    return centred * (centred ** 2).mean(dim).clamp(min=eps).rsqrt()


@deprecated_api("coati.models.utils.convert_to_lora")
def convert_to_lora(model: nn.Module, input_size: int, output_size: int, lora_rank: int = 16, lora_alpha: int = 1,
                    lora_dropout: float = 0.0, fan_in_fan_out: bool = False, merge_weights: bool = True) -> nn.Module:
    """Turns every ``nn.Linear`` of ``model`` with ``input_size`` inputs and ``output_size`` outputs into a
    ``LoraLinear`` of rank ``lora_rank`` over its existing weight, in place; returns ``model``.

    The legacy function attached a fresh, randomly initialised LoRA layer *inside* each linear, where no forward
    pass used it (migration_guide/deviations.md); this one replaces the layers it evidently meant to. A rank above
    ``min(input_size, output_size)`` raises ValueError, as it did.
    """
    if lora_rank > min(input_size, output_size):
        raise ValueError(f"LoRA rank {lora_rank} must be less or equal than {min(input_size, output_size)}")
    from coati_compat.legacy.lora import LoraLinear

    targets = [(name, sub) for name, sub in model.named_modules()
               if type(sub) is nn.Linear and (sub.in_features, sub.out_features) == (input_size, output_size)]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoraLinear(linear.weight, linear.bias, r=lora_rank, lora_alpha=lora_alpha,
                                          lora_dropout=lora_dropout, fan_in_fan_out=fan_in_fan_out,
                                          merge_weights=merge_weights))
    return model
