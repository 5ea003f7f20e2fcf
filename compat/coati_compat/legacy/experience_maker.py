"""Legacy ``coati.experience_maker``: ``ExperienceMaker`` and ``NaiveExperienceMaker``, the PPO experience step of
the legacy maker (legacy_spec §A.5, steps 1-7):

1. sample ``sequences`` with the actor's legacy loop (``Actor.generate``);
2. ``attention_mask = sequences != pad_token_id``;
3. ``action_mask``: the generated span, True up to and including the first EOS;
4. log-probs of the actions under the actor and under the initial model;
5. ``value = critic(sequences, action_mask, attention_mask)`` [B], ``r = reward_model(sequences, attention_mask)`` [B];
6. ``reward = r - kl_coef * KL`` (k3 estimate, masked mean over the actions; ``kl_coef <= 0``: ``r``);
7. ``advantage = reward - value``, [B,1].
Steps 6 and 7 are ``coati_compat.legacy.ppo_shaping.legacy_kl_shaped_reward`` and ``legacy_advantage``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Optional, Tuple

import torch
from torch import nn

from coati_compat.deprecations import deprecated_api
from coati_compat.legacy.experience import Experience
from coati_compat.legacy.ppo_shaping import legacy_advantage, legacy_kl_shaped_reward

__all__ = ["Experience", "ExperienceMaker", "NaiveExperienceMaker"]


@deprecated_api("coati.experience_maker.ExperienceMaker")
class ExperienceMaker(ABC):
    """Holds the four models of the PPO experience step; subclasses implement ``make_experience``."""

    def __init__(self, actor: nn.Module, critic: nn.Module, reward_model: nn.Module, initial_model: nn.Module,
                 kl_coef: float = 0.1) -> None:
        super().__init__()
        if isinstance(kl_coef, bool) or not isinstance(kl_coef, (int, float)):
            raise TypeError(f"kl_coef must be a number, got {type(kl_coef).__name__} (the 5th positional argument "
                            "of NaiveExperienceMaker is kl_coef)")
        self.actor = actor
        self.critic = critic
        self.reward_model = reward_model
        self.initial_model = initial_model
        self.kl_coef = float(kl_coef)
        # Non-legacy: what samples, with ``Actor.generate``'s signature and return (None: the actor's legacy loop).
        self.sample_fn: Optional[Callable[..., Tuple[torch.Tensor, Any, Any]]] = None

    @abstractmethod
    def make_experience(self, input_ids: torch.Tensor, **generate_kwargs: Any) -> Experience:
        """input_ids: [B,P] left-padded prompts. Returns an ``Experience`` of B samples."""


@deprecated_api("coati.experience_maker.NaiveExperienceMaker")
class NaiveExperienceMaker(ExperienceMaker):
    """The legacy experience step (see the module docstring)."""

    @torch.no_grad()
    def make_experience(self, input_ids: torch.Tensor, **generate_kwargs: Any) -> Experience:
        for model in (self.actor, self.critic, self.reward_model, self.initial_model):
            model.eval()
        sample = self.sample_fn or self.actor.generate
        sequences, attention_mask, action_mask = sample(input_ids, return_action_mask=True, **generate_kwargs)
        return self.experience_from_sequences(sequences, attention_mask, action_mask)

    @torch.no_grad()
    def experience_from_sequences(self, sequences: torch.Tensor, attention_mask: Optional[torch.Tensor],
                                  action_mask: torch.Tensor) -> Experience:
        """Steps 4-7 for given samples. sequences, attention_mask: [B,S]; action_mask: [B,A] (A < S)."""
        num_actions = action_mask.size(1)
        action_log_probs = self.actor(sequences, num_actions, attention_mask)
        base_action_log_probs = self.initial_model(sequences, num_actions, attention_mask)
        value = self.critic(sequences, action_mask, attention_mask)
        r = self.reward_model(sequences, attention_mask)
        reward = legacy_kl_shaped_reward(r, action_log_probs, base_action_log_probs, action_mask, self.kl_coef)
        advantage = legacy_advantage(reward, value)
        return Experience(sequences, action_log_probs, value, reward, advantage, attention_mask, action_mask)
