"""The learning-rate schedule of a `coati_relay.training.booster_backend.TrainingBackend` and the checks of its
optimizer arguments."""
from __future__ import annotations

import math
from typing import Optional, Tuple


class WarmupSchedule:
    """LR factor per step: linear warmup to 1 over ``warmup_steps``, then constant or cosine down to
    ``min_lr_ratio`` at ``total_steps``. A plain object so that `LambdaLR.state_dict` records its fields."""

    def __init__(self, kind: str, warmup_steps: int, total_steps: Optional[int], min_lr_ratio: float) -> None:
        self.kind, self.warmup_steps = kind, warmup_steps
        self.total_steps, self.min_lr_ratio = total_steps, min_lr_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def check_args(lr: float, weight_decay: float, betas: Tuple[float, float], max_grad_norm: Optional[float],
                scheduler: Optional[str], total_steps: Optional[int], warmup_steps: int, min_lr_ratio: float) -> None:
    if not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"TrainingBackend: lr must be a positive number, got {lr!r}")
    if weight_decay < 0:
        raise ValueError(f"TrainingBackend: weight_decay must be >= 0, got {weight_decay}")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"TrainingBackend: betas must be two numbers in [0, 1), got {betas!r}")
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"TrainingBackend: max_grad_norm must be > 0 or None, got {max_grad_norm}")
    if scheduler not in (None, "constant", "cosine"):
        raise ValueError(f"TrainingBackend: scheduler must be None, 'constant' or 'cosine', got {scheduler!r}")
    if warmup_steps < 0:
        raise ValueError(f"TrainingBackend: warmup_steps must be >= 0, got {warmup_steps}")
    if scheduler == "cosine" and (total_steps is None or total_steps <= warmup_steps):
        raise ValueError(f"TrainingBackend: scheduler 'cosine' needs total_steps > warmup_steps ({warmup_steps}), "
                         f"got total_steps={total_steps}")
    if not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"TrainingBackend: min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
