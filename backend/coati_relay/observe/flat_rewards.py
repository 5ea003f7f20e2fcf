"""One warning when a run cannot learn: every group's responses scored the same for several rounds in a row, so a
group baseline (GRPO, DAPO, RLOO, ...) gives every response an advantage of 0 and the loss is 0.

The learner puts ``frac_reward_zero_std`` (the fraction of groups whose rewards are all equal) in each round's
metrics (`coati_relay.roles.learner`); `FlatRewardWatch` reads it where the driver records the round.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

log = logging.getLogger(__name__)

ROUNDS = 3  # consecutive rounds without any reward variance before the warning


class FlatRewardWatch:
    """Warns once per run after `ROUNDS` consecutive rounds with ``frac_reward_zero_std`` = 1. Silent where the
    warning would be wrong: one response per prompt (no group to compare within) or an estimator with a critic
    (whose advantages do not need reward variance)."""

    def __init__(self, group_size: int, needs_critic: bool, rounds: int = ROUNDS):
        self.applies = group_size > 1 and not needs_critic
        self.rounds = rounds
        self.flat = 0
        self.warned = False

    @classmethod
    def for_run(cls, cfg: Any) -> "FlatRewardWatch":
        """The watch of a run (`coati_relay.config.schema.RunConfig`)."""
        from coati_relay import algorithms

        return cls(cfg.batches.num_generations, algorithms.spec(cfg.core_algo).needs_critic)

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Reads training step ``step``'s metrics."""
        if not self.applies or self.warned:
            return
        self.flat = self.flat + 1 if metrics.get("frac_reward_zero_std") == 1.0 else 0
        if self.flat >= self.rounds:
            self.warned = True
            log.warning("steps %d-%d: no group has reward variance (every response to a prompt scored the same; "
                        "mean reward %.3g): the loss is 0 and nothing learns; check the reward function against "
                        "your data", step - self.flat + 1, step, metrics.get("reward", float("nan")))
