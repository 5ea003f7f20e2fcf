"""The learning-rate schedule of a `coati_relay.training.booster_backend.TrainingBackend` and the checks of its
optimizer arguments."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

from coati_relay.config.checks import LR_SCHEDULERS, is_positive

# ColossalChat's GRPOConsumer: CosineAnnealingWarmupLR(total_steps=min(num_episodes, 4) * updates per episode,
# warmup_steps=0, eta_min=0.1 * lr), stepped once per update (round) in BaseConsumer.loop.
COLOSSALCHAT_EPISODES, COLOSSALCHAT_MIN_LR_RATIO = 4, 0.1


def colossalchat_cosine_rounds(num_episodes: int, rounds_per_episode: int) -> int:
    """The period parameter T of ColossalChat's cosine, in rounds: ``min(num_episodes, 4) * rounds_per_episode``."""
    return min(num_episodes, COLOSSALCHAT_EPISODES) * rounds_per_episode


def cosine_factor(r: int, total: int, min_lr_ratio: float) -> float:
    """The closed form of the cosine: ``min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi * r / total)) / 2``."""
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * r / total))


def colossalchat_factors(total: int, rounds: int, min_lr_ratio: float) -> List[float]:
    """The LR factor of each of ``rounds`` rounds as ColossalChat's scheduler gives it: colossalai's
    ``CosineAnnealingWarmupLR(total_steps=total, warmup_steps=0, eta_min=min_lr_ratio * lr)`` stepped once per
    round, run on a dummy optimizer. Its recursive update (torch's CosineAnnealingLR under colossalai's
    WarmupScheduler) starts a little above lr (0.56% for total 20) and meets the closed form `cosine_factor` at
    round ``total``; without colossalai, the closed form."""
    try:
        from colossalai.nn.lr_scheduler import CosineAnnealingWarmupLR
    except ImportError:
        return [cosine_factor(r, total, min_lr_ratio) for r in range(rounds)]
    import warnings

    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scheduler = CosineAnnealingWarmupLR(optimizer, total_steps=total, warmup_steps=0, eta_min=min_lr_ratio)
        out = []
        for _ in range(rounds):
            out.append(float(optimizer.param_groups[0]["lr"]))
            optimizer.step()
            scheduler.step()
    return out


class WarmupSchedule:
    """LR factor per optimizer step.

    ``constant`` / ``cosine``: linear warmup to 1 over ``warmup_steps``, then constant or cosine down to
    ``min_lr_ratio`` at ``total_steps`` (held there after). ``colossalchat``: ColossalChat's schedule (torch's
    CosineAnnealingLR under colossalai's CosineAnnealingWarmupLR with no warmup) in rounds of ``steps_per_round``
    optimizer steps, ``total_steps`` being T in rounds: round r trains at ``factors[r]`` (`colossalchat_factors`
    for the run's ``rounds``), which is ``min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi * r / T)) / 2`` up to
    the scheduler's recursion and periodic: past T it rises again, as torch's does. A plain object so that
    `LambdaLR.state_dict` records its fields."""

    def __init__(self, kind: str, warmup_steps: int, total_steps: Optional[int], min_lr_ratio: float,
                 steps_per_round: int = 1, rounds: int = 0) -> None:
        self.kind, self.warmup_steps = kind, warmup_steps
        self.total_steps, self.min_lr_ratio = total_steps, min_lr_ratio
        self.steps_per_round = steps_per_round
        self.factors = colossalchat_factors(total_steps, rounds, min_lr_ratio) if kind == "colossalchat" else []

    def __call__(self, step: int) -> float:
        if self.kind == "colossalchat":
            r = step // self.steps_per_round
            return self.factors[r] if r < len(self.factors) else cosine_factor(r, self.total_steps,
                                                                              self.min_lr_ratio)
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def check_args(lr: float, weight_decay: float, betas: Tuple[float, float], max_grad_norm: Optional[float],
               scheduler: Optional[str], total_steps: Optional[int], warmup_steps: int, min_lr_ratio: float,
               steps_per_round: int = 1) -> None:
    if not is_positive(lr):
        raise ValueError(f"TrainingBackend: lr must be a positive number, got {lr!r}")
    if weight_decay < 0:
        raise ValueError(f"TrainingBackend: weight_decay must be >= 0, got {weight_decay}")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"TrainingBackend: betas must be two numbers in [0, 1), got {betas!r}")
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"TrainingBackend: max_grad_norm must be > 0 or None, got {max_grad_norm}")
    if scheduler not in LR_SCHEDULERS:
        raise ValueError(f"TrainingBackend: scheduler must be one of {list(LR_SCHEDULERS)}, got {scheduler!r}")
    if scheduler == "colossalchat":
        if warmup_steps:
            raise ValueError("TrainingBackend: scheduler 'colossalchat' has no warmup (ColossalChat's uses none); "
                             f"got warmup_steps={warmup_steps}")
        if not isinstance(total_steps, int) or total_steps < 1 or not isinstance(steps_per_round, int) \
                or steps_per_round < 1:
            raise ValueError(f"TrainingBackend: scheduler 'colossalchat' needs total_steps (T, in rounds) >= 1 and "
                             f"steps_per_round >= 1, got {total_steps!r} and {steps_per_round!r}")
    if warmup_steps < 0:
        raise ValueError(f"TrainingBackend: warmup_steps must be >= 0, got {warmup_steps}")
    elif scheduler == "cosine" and (total_steps is None or total_steps <= warmup_steps):
        raise ValueError(f"TrainingBackend: scheduler 'cosine' needs total_steps > warmup_steps ({warmup_steps}), "
                         f"got total_steps={total_steps}")
    if not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"TrainingBackend: min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
