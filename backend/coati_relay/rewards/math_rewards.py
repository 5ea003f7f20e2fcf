"""Rule-based math rewards: the last ``\\boxed{...}`` answer, or ``<think>..</think><answer>..</answer>`` tags.

Scores follow ColossalChat's verifiable reward: 10 for a correct answer in a valid format, 0 otherwise (a valid
format alone earns ``FORMAT_SCORE`` = 0). Answers are compared with ``math_verify`` when it is importable (both
sides wrapped in ``\\boxed{}``; an unparseable prediction that matches exactly earns 5), else by normalised exact
match (`normalize_answer`). `soft_overlength_penalty` applies the length rule on token counts, which the
text-level reward functions cannot see.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from coati_relay.rewards.registry import register_reward

try:
    import math_verify as _math_verify
except ImportError:
    _math_verify = None

CORRECT_SCORE = 10.0
UNPARSED_MATCH_SCORE = 5.0
FORMAT_SCORE = 0.0
THINK_ANSWER_TAGS = ("<think>", "</think>", "<answer>", "</answer>")

_BOXED = re.compile(r"\\boxed\s*\{")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_DROPPED = ("\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\(", "\\)", "\\[", "\\]", "$")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")
_NUMBER = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?")


@dataclass(frozen=True)
class MathGrade:
    """One graded response: format valid, answer correct, and the reward."""

    format_ok: bool
    answer_ok: bool
    reward: float


def extract_boxed(text: str) -> Optional[str]:
    """Content of the last ``\\boxed{...}`` (nested braces allowed), stripped; None if absent or unclosed."""
    starts = list(_BOXED.finditer(text))
    if not starts:
        return None
    begin = starts[-1].end()
    depth = 1
    for j in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[begin:j].strip()
    return None


def extract_answer_tag(text: str) -> Optional[str]:
    """Content of the last ``<answer>...</answer>``, stripped; None if absent."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def tags_valid(text: str, tags: Sequence[str] = THINK_ANSWER_TAGS) -> bool:
    """Each tag occurs exactly once, the tags appear in the given order, and the text ends with the last tag."""
    if any(text.count(tag) != 1 for tag in tags):
        return False
    positions = [text.index(tag) for tag in tags]
    return positions == sorted(positions) and text.rstrip().endswith(tags[-1])


def normalize_answer(answer) -> str:
    """Canonical text of an answer for exact matching.

    Unwraps ``\\boxed{}``, ``\\text{}``-like macros and math delimiters, drops spacing macros, whitespace, a
    trailing period and thousands separators, lower-cases, maps ``\\dfrac``/``\\tfrac`` to ``\\frac`` and writes
    plain decimals canonically (``3.50`` -> ``3.5``, ``+007`` -> ``7``). Equivalent forms such as ``1/2`` and
    ``0.5`` stay different (that needs ``math_verify``).
    """
    s = str(answer).strip()
    boxed = extract_boxed(s)
    if boxed is not None:
        s = boxed
    for token in _DROPPED:
        s = s.replace(token, "")
    s = _TEXT_MACRO.sub(r"\1", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s).rstrip(".").lower()
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    number = _NUMBER.fullmatch(s)
    if number and any(c.isdigit() for c in s):
        sign, whole, frac = number.group(1), number.group(2).lstrip("0") or "0", (number.group(3) or "").rstrip("0")
        is_zero = whole == "0" and not frac
        s = ("-" if sign == "-" and not is_zero else "") + whole + ("." + frac if frac else "")
    return s


def score_answer(prediction: Optional[str], gt_answer) -> float:
    """10 when ``prediction`` equals ``gt_answer`` (see module docstring), 5 for an exact match math_verify cannot
    parse, else 0. A missing prediction or ground truth scores 0."""
    if prediction is None or gt_answer is None:
        return 0.0
    exact = normalize_answer(prediction) == normalize_answer(gt_answer)
    if _math_verify is None:
        return CORRECT_SCORE if exact else 0.0
    parsed = _math_verify.parse(f"\\boxed{{{prediction}}}")
    if parsed:
        gold = _math_verify.parse(f"\\boxed{{{gt_answer}}}")
        return CORRECT_SCORE if _math_verify.verify(gold, parsed) else 0.0
    return UNPARSED_MATCH_SCORE if exact else 0.0


def _grade(format_ok: bool, prediction: Optional[str], gt_answer) -> MathGrade:
    if not format_ok:
        return MathGrade(False, False, 0.0)
    score = score_answer(prediction, gt_answer)
    return MathGrade(True, score > 0, score if score > 0 else FORMAT_SCORE)


def grade_think_answer(response: str, gt_answer, tags: Sequence[str] = THINK_ANSWER_TAGS) -> MathGrade:
    """Format: `tags_valid`; answer: the last ``<answer>`` content."""
    return _grade(tags_valid(response, tags), extract_answer_tag(response), gt_answer)


def grade_boxed(response: str, gt_answer) -> MathGrade:
    """Format: a closed ``\\boxed{}`` exists; answer: its last content."""
    prediction = extract_boxed(response)
    return _grade(prediction is not None, prediction, gt_answer)


@register_reward("think_answer_tags")
def think_answer_reward(responses: List[str], gt_answers: List, prompts: List[str]) -> torch.Tensor:
    """[N]: 10 when the think/answer format is valid and the ``<answer>`` is correct, else 0."""
    return torch.tensor([grade_think_answer(r, gt).reward for r, gt in zip(responses, gt_answers)],
                        dtype=torch.float32)


@register_reward("boxed")
def boxed_reward(responses: List[str], gt_answers: List, prompts: List[str]) -> torch.Tensor:
    """[N]: 10 when the last ``\\boxed{}`` answer is correct, else 0."""
    return torch.tensor([grade_boxed(r, gt).reward for r, gt in zip(responses, gt_answers)], dtype=torch.float32)


def soft_overlength_penalty(rewards: torch.Tensor, response_lengths: torch.Tensor, max_new_tokens: int,
                            cache_length: int, scale: float = 10.0) -> torch.Tensor:
    """DAPO's length rule on token counts. rewards, response_lengths: [N]. Returns [N].

    With L = max_new_tokens and c = cache_length: ``len >= L`` -> reward 0 (truncated);
    ``L - c < len < L`` -> reward + ((L - c) - len) / c * scale; shorter responses keep their reward.
    """
    if not 0 < cache_length <= max_new_tokens:
        raise ValueError(f"soft_overlength_penalty needs 0 < cache_length <= max_new_tokens, got cache_length="
                         f"{cache_length}, max_new_tokens={max_new_tokens}")
    if rewards.shape != response_lengths.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and response_lengths {tuple(response_lengths.shape)} "
                         "must both be [N]")
    lengths = response_lengths.to(rewards.dtype)
    start = max_new_tokens - cache_length
    penalty = torch.where(lengths > start, (start - lengths) / cache_length * scale, torch.zeros_like(rewards))
    return torch.where(lengths >= max_new_tokens, torch.zeros_like(rewards), rewards + penalty)
