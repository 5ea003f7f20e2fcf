"""Toy-task rewards (see `coati_relay.toy`): simple enough for a random tiny model to learn within minutes on CPU."""
from __future__ import annotations

from typing import List, Optional

import torch

from coati_relay.rewards.registry import register_reward

DEFAULT_LETTER = "a"


def letter_fraction(response: str, letter: Optional[str]) -> float:
    """Fraction of the non-space characters of ``response`` equal to ``letter`` (None: "a"); 0.0 if none."""
    letter = DEFAULT_LETTER if letter is None else letter
    if not isinstance(letter, str) or len(letter) != 1:
        raise ValueError(f"toy_letter: gt_answer must be a single character or None, got {letter!r}")
    chars = [c for c in response if not c.isspace()]
    return sum(c == letter for c in chars) / len(chars) if chars else 0.0


@register_reward("toy_letter")
def toy_letter_reward(responses: List[str], gt_answers: List, prompts: List[str]) -> torch.Tensor:
    """[N]: for each response, the fraction of its non-space characters that equal its gt letter (in [0, 1])."""
    return torch.tensor([letter_fraction(r, gt) for r, gt in zip(responses, gt_answers)], dtype=torch.float32)
