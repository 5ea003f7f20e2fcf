"""Stops training at the step that makes a loss or a weight non-finite, naming the likely cause.

Without these checks a NaN weight travels with the next weight push to the producers, which then fail much later in
sampling ("probability tensor contains inf/nan"), far from the step that caused it. `TrainingBackend` runs them on
every ``backward`` (the loss, before its backward: one host sync) and every ``step`` (the weights, after the
optimizer step: one reduction per tensor and one host sync); ``check_finite=False`` turns them off. A model that
Gemini holds is never read parameter by parameter (its chunks may be freed outside its hooks): its step is checked
before it is applied, from the count of non-finite gradient chunks Gemini keeps (`check_gradient_chunks`); under
fp16, where Gemini skips such a step itself, each skip is logged and a skip at the smallest loss scale is an error
(`check_overflow_skip`).
"""
from __future__ import annotations

import logging
from dataclasses import fields, is_dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from .master_weights import LOW_PRECISION, all_finite, find_master_optimizer

log = logging.getLogger(__name__)
SKIPS_WARNED = 4  # fp16 steps skipped in a row from which each skip is a warning (the first few are the scale's search)


class NonFiniteTrainingError(FloatingPointError):
    """A loss or a weight became inf/NaN during a training step."""


def _tensor_fields(batch: Any) -> Dict[str, Any]:
    if isinstance(batch, Mapping):
        return dict(batch)
    if is_dataclass(batch):
        return {f.name: getattr(batch, f.name) for f in fields(batch)}
    return dict(vars(batch)) if hasattr(batch, "__dict__") else {}


def non_finite_fields(batch: Any) -> List[str]:
    """The names of the floating-point tensors of ``batch`` (a mapping, dataclass or plain object) holding inf/NaN."""
    return [name for name, value in _tensor_fields(batch).items()
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all()]


def learning_rates(optimizer: Optional[Any]) -> List[float]:
    return [] if optimizer is None else [group.get("lr") for group in optimizer.param_groups]


def check_losses(step: int, losses: Dict[str, torch.Tensor], batch: Any, optimizers: Dict[str, Any]) -> None:
    """Raises `NonFiniteTrainingError` when a loss of training step ``step`` (1-based) is inf/NaN, before its
    backward; the cause named is the batch (its non-finite fields) or the forward pass."""
    bad = [name for name, loss in losses.items() if not torch.isfinite(loss.detach()).all()]
    if not bad:
        return
    batch_fields = non_finite_fields(batch) if batch is not None else []
    if batch_fields:
        cause = (f"the experience batch itself holds inf/NaN in {batch_fields}: the models that made it produced "
                 "them (check the weights the rollout workers hold and the reward model's output)")
    else:
        rates = {name: learning_rates(opt) for name, opt in optimizers.items()}
        cause = (f"the forward pass overflowed on a finite batch: a learning rate too high ({rates}) or a "
                 "low-precision model (fp16 overflows above 65504)")
    raise NonFiniteTrainingError(f"training step {step}: {', '.join(bad)} is not finite; likely cause: {cause}. "
                                 "The step was not applied.")


def check_weights(step: int, models: Dict[str, nn.Module], optimizers: Dict[str, Any]) -> None:
    """Raises `NonFiniteTrainingError` when the optimizer step of training step ``step`` left an inf/NaN weight."""
    for name, model in models.items():
        params = [p for p in model.parameters() if p.is_floating_point()]
        if all_finite(params):
            continue
        bad = [n for n, p in model.named_parameters() if p.is_floating_point() and not torch.isfinite(p).all()]
        optimizer = optimizers.get(name)
        low = sorted({str(p.dtype) for p in params if p.dtype in LOW_PRECISION})
        if low and find_master_optimizer(optimizer) is None:
            cause = (f"the optimizer stepped {'/'.join(low)} weights without fp32 master weights (Adam's eps "
                     "vanishes in fp16); use a plugin that keeps masters, or build the model in fp32")
        else:
            cause = f"the update diverged (learning rates {learning_rates(optimizer)})"
        raise NonFiniteTrainingError(f"training step {step}: the {name} holds inf/NaN weights after the optimizer "
                                     f"step ({len(bad)} tensors, first {bad[0]!r}); likely cause: {cause}")


def check_gradient_chunks(step: int, name: str, non_finite_chunks: int, optimizer: Optional[Any]) -> None:
    """Raises `NonFiniteTrainingError` when Gemini counted ``non_finite_chunks`` > 0 gradient chunks holding inf/NaN
    before the optimizer step of training step ``step`` (the step is then not applied)."""
    if non_finite_chunks <= 0:
        return
    raise NonFiniteTrainingError(
        f"training step {step}: the {name}'s gradients hold inf/NaN ({non_finite_chunks} of Gemini's gradient "
        f"chunks); likely cause: the backward overflowed (learning rates {learning_rates(optimizer)}, or a loss "
        "too large for bf16). The step was not applied.")


def check_overflow_skip(step: int, name: str, skip: Optional[Tuple[float, float]], in_a_row: int,
                        optimizer: Optional[Any]) -> None:
    """After training step ``step`` under fp16 Gemini: ``skip`` = ``(loss scale, its minimum)`` when Gemini skipped
    the step for an overflow (`GeminiStepGuard.overflow_skip`). Logs the skip (a warning from `SKIPS_WARNED` in a
    row on), and raises `NonFiniteTrainingError` once the scale is at its minimum: no later step can apply."""
    if skip is None:
        return
    scale, minimum = skip
    if scale <= minimum:
        raise NonFiniteTrainingError(
            f"training step {step}: the {name}'s fp16 gradients overflowed at Gemini's smallest loss scale ({scale:g}),"
            f" {in_a_row} steps skipped in a row: no step can apply, so the run trains nothing. Likely cause: the "
            f"loss or the learning rates ({learning_rates(optimizer)}) are too large for fp16; train in bf16 "
            "(precision='bf16') or lower them.")
    log.log(logging.WARNING if in_a_row >= SKIPS_WARNED else logging.INFO,
            "training step %d: the %s's fp16 gradients overflowed; Gemini skipped the step and its loss scale is now "
            "%g (%d steps skipped in a row)", step, name, scale, in_a_row)
