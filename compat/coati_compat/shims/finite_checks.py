"""Stops a legacy training run at the step that makes a loss or a weight non-finite, naming the likely cause.

Without these checks a NaN weight travels with the next push to the makers, which then fail much later in sampling
("probability tensor contains inf/nan"), far from the step that caused it.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import torch
from torch import nn

from coati_compat.legacy.master_weights import LOW_PRECISION, find_master_optimizer


class NonFiniteTrainingError(FloatingPointError):
    """A loss or a weight became inf/NaN during a legacy training step."""


def _bad_tensor_fields(obj: Any, fields: Iterable[str]) -> List[str]:
    bad = []
    for name in fields:
        value = getattr(obj, name, None)
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all():
            bad.append(name)
    return bad


def check_losses(step: int, losses: Dict[str, torch.Tensor], experience: Any,
                 optimizers: Dict[str, Any]) -> None:
    """Raises `NonFiniteTrainingError` when a loss of training step ``step`` (1-based) is inf/NaN, before its
    backward; the cause named is the batch (non-finite fields) or the forward pass."""
    bad = [name for name, loss in losses.items() if not torch.isfinite(loss.detach()).all()]
    if not bad:
        return
    fields = _bad_tensor_fields(experience, ("action_log_probs", "values", "reward", "advantages"))
    if fields:
        cause = (f"the experience batch itself holds inf/NaN in {fields}: the makers' models produced them (check "
                 "the weights the makers hold and the reward model's output)")
    else:
        cause = (f"the forward pass overflowed on a finite batch: a learning rate too high "
                 f"({learning_rates(optimizers)}) or a low-precision model (fp16 overflows above 65504)")
    raise NonFiniteTrainingError(f"training step {step}: {', '.join(bad)} is not finite; likely cause: {cause}. "
                                 "The step was not applied.")


def check_weights(step: int, models: Dict[str, nn.Module], optimizers: Dict[str, Any]) -> None:
    """Raises `NonFiniteTrainingError` when the optimizer step of training step ``step`` left an inf/NaN weight."""
    for name, model in models.items():
        bad = [n for n, p in model.named_parameters() if p.is_floating_point() and not torch.isfinite(p).all()]
        if not bad:
            continue
        optimizer = optimizers.get(name)
        low = sorted({str(p.dtype) for p in model.parameters() if p.dtype in LOW_PRECISION})
        if low and find_master_optimizer(optimizer) is None:
            cause = (f"the optimizer stepped {'/'.join(low)} weights without fp32 master weights (Adam's eps "
                     "vanishes in fp16); use a strategy that keeps masters, or build the model in fp32")
        else:
            cause = f"the update diverged (learning rates {_learning_rates(optimizer)})"
        raise NonFiniteTrainingError(f"training step {step}: the {name} holds inf/NaN weights after the optimizer "
                                     f"step ({len(bad)} tensors, first {bad[0]!r}); likely cause: {cause}")


def _learning_rates(optimizer: Optional[Any]) -> List[float]:
    if optimizer is None:
        return []
    return [group.get("lr") for group in optimizer.param_groups]


def learning_rates(optimizers: Dict[str, Any]) -> Dict[str, List[float]]:
    return {name: _learning_rates(opt) for name, opt in optimizers.items()}
