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

Both releases' constructor forms are served: ``(actor, critic, reward_model, initial_model[, kl_coef])`` (reference
version) and ``(actor, critic, reward_model, initial_model, tokenizer[, kl_coef])`` (final release, whose
``make_experience`` took ``pad_token_id`` and ``eos_token_id`` from the tokenizer). A number in the 5th place is
``kl_coef``; an object with ``pad_token_id`` and ``eos_token_id`` is the tokenizer.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.experience import Experience
from coati_compat.legacy.ppo_shaping import legacy_advantage, legacy_kl_shaped_reward

__all__ = ["Experience", "ExperienceMaker", "NaiveExperienceMaker"]

DEFAULT_KL_COEF = 0.1


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_tokenizer(value: Any) -> bool:
    return hasattr(value, "pad_token_id") and hasattr(value, "eos_token_id")


def _tokenizer_and_kl_coef(positional: Sequence[Any], tokenizer: Any, kl_coef: Any) -> Tuple[Any, float]:
    """``(tokenizer or None, kl_coef)`` from the arguments after ``initial_model``: ``[kl_coef]`` (reference
    version) or ``[tokenizer[, kl_coef]]`` (final release), positional or by keyword."""
    rest = list(positional)
    if rest and not _is_number(rest[0]):
        if not _is_tokenizer(rest[0]):
            raise TypeError(f"kl_coef must be a number, got {type(rest[0]).__name__}; the 5th positional argument "
                            "of the experience maker is kl_coef (a number) or, in the final release's form, a "
                            "tokenizer (an object with pad_token_id and eos_token_id)")
        if tokenizer is not None:
            raise TypeError("the experience maker got a tokenizer both as 5th positional argument and as tokenizer=")
        tokenizer = rest.pop(0)
    if len(rest) > 1 or (rest and kl_coef is not None):
        raise TypeError("the experience maker takes (actor, critic, reward_model, initial_model[, tokenizer]"
                        f"[, kl_coef]); got {len(positional)} arguments after initial_model"
                        + (" and kl_coef=" if kl_coef is not None else ""))
    if rest:
        kl_coef = rest[0]
    if tokenizer is not None and not _is_tokenizer(tokenizer):
        raise TypeError(f"tokenizer must have pad_token_id and eos_token_id, got {type(tokenizer).__name__}")
    kl_coef = DEFAULT_KL_COEF if kl_coef is None else kl_coef
    if not _is_number(kl_coef):
        raise TypeError(f"kl_coef must be a number, got {type(kl_coef).__name__}")
    return tokenizer, kl_coef


@deprecated_api("coati.experience_maker.ExperienceMaker")
class ExperienceMaker(ABC):
    """Holds the four models of the PPO experience step; subclasses implement ``make_experience``."""

    def __init__(self, actor: nn.Module, critic: nn.Module, reward_model: nn.Module, initial_model: nn.Module,
                 *tokenizer_or_kl_coef: Any, tokenizer: Any = None, kl_coef: Optional[float] = None) -> None:
        super().__init__()
        self.tokenizer, kl_coef = _tokenizer_and_kl_coef(tokenizer_or_kl_coef, tokenizer, kl_coef)
        self.actor = actor
        self.critic = critic
        self.reward_model = reward_model
        self.initial_model = initial_model
        self.kl_coef = float(kl_coef)
        # Non-legacy: what samples, with ``Actor.generate``'s signature and return (None: the actor's legacy loop).
        self.sample_fn: Optional[Callable[..., Tuple[torch.Tensor, Any, Any]]] = None

    def generate_kwargs(self, generate_kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """``generate_kwargs`` with the tokenizer's ``pad_token_id`` and ``eos_token_id`` where absent (final-release
        form; without a tokenizer the keywords are used as given)."""
        if self.tokenizer is None:
            return generate_kwargs
        padding_side = getattr(self.tokenizer, "padding_side", "left")
        if padding_side != "left":
            raise ValueError(f"the experience maker's tokenizer pads on the {padding_side!r}; the legacy sampling "
                             "loop needs left-padded prompts (set tokenizer.padding_side = 'left')")
        out = dict(generate_kwargs)
        out.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        out.setdefault("eos_token_id", self.tokenizer.eos_token_id)
        return out

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
        sequences, attention_mask, action_mask = sample(input_ids, return_action_mask=True,
                                                        **self.generate_kwargs(generate_kwargs))
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
