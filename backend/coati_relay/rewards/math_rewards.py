"""Rule-based math rewards: the last ``\\boxed{...}`` answer, or ``<think>..</think><answer>..</answer>`` tags.

Answers are judged as ColossalChat judges them (4f9953be3, ``coati/distributed/reward/reward_fn.py``):
``math_verify`` under its extraction settings (`verify_status`), then a plain-text match (`score_answer`).
A correct answer in a valid format earns 10 (5 when only the text matches and math_verify cannot parse the
prediction); anything else 0. The table of `tests/data/colossalchat/rewards.json` pins this down.
`soft_overlength_penalty` applies the length rule on token counts, which the text-level reward functions cannot see.
"""
from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from coati_relay.rewards.registry import register_reward

CORRECT_SCORE = 10.0
UNPARSED_MATCH_SCORE = 5.0
FORMAT_SCORE = 0.0
THINK_ANSWER_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
MATH_VERIFY_PIN = "math-verify==0.9.0"

# verify_status results
VERIFIED, NOT_EQUAL, GOLD_UNPARSED, PREDICTION_UNPARSED = 1, 0, -1, -2

_BOXED_OPEN = "\\boxed{"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class MathGrade:
    """One graded response: format valid, answer correct, and the reward."""

    format_ok: bool
    answer_ok: bool
    reward: float


def extract_boxed(text: str) -> Optional[str]:
    """Content of the last ``\\boxed{`` (spelled exactly so; nested braces allowed), stripped; None when there is
    none or that last one is never closed."""
    start = text.rfind(_BOXED_OPEN)
    if start < 0:
        return None
    begin, depth = start + len(_BOXED_OPEN), 1
    for j in range(begin, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:j].strip()
    return None


def extract_answer_tag(text: str) -> Optional[str]:
    """Content of the last ``<answer>...</answer>``, stripped; None if absent."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def tags_valid(text: str, tags: Sequence[str] = THINK_ANSWER_TAGS) -> bool:
    """Each tag occurs exactly once, the tags appear in the given order, and the text ends with the last tag
    (nothing after it, whitespace included)."""
    if any(text.count(tag) != 1 for tag in tags):
        return False
    positions = [text.index(tag) for tag in tags]
    return positions == sorted(positions) and text.endswith(tags[-1])


@functools.lru_cache(maxsize=None)
def _checker():
    """math_verify and ColossalChat's extraction settings (expressions, and LaTeX with boxed content first)."""
    try:
        import math_verify
        from latex2sympy2_extended import NormalizationConfig
    except ImportError as exc:
        raise ImportError(f"the math rewards check answers with math_verify, as ColossalChat does: pip install "
                          f"'{MATH_VERIFY_PIN}'") from exc
    normalization = NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True, boxed="all",
                                        units=True)
    config = (math_verify.ExprExtractionConfig(),
              math_verify.LatexExtractionConfig(normalization_config=normalization, boxed_match_priority=0))
    return math_verify, config


def _in_box(text: str) -> str:
    return text if text.startswith(_BOXED_OPEN) else _BOXED_OPEN + text + "}"


def verify_status(prediction: str, gt_answer: str) -> int:
    """`VERIFIED` or `NOT_EQUAL` by math_verify (each side put in ``\\boxed{}`` unless it starts with one),
    `GOLD_UNPARSED` / `PREDICTION_UNPARSED` when a side yields nothing; an error inside math_verify: `NOT_EQUAL`.

    math_verify bounds its work with SIGALRM, which only the main thread may set; elsewhere it runs without that
    bound (the result is the same; ColossalChat's call fails there and scores every answer 0)."""
    mv, config = _checker()
    main = threading.current_thread() is threading.main_thread()
    parse_kw, verify_kw = ({}, {}) if main else ({"parsing_timeout": None}, {"timeout_seconds": None})
    try:
        gold = mv.parse(_in_box(gt_answer), extraction_config=config, **parse_kw)
        if not gold:
            return GOLD_UNPARSED
        pred = mv.parse(_in_box(prediction), extraction_config=config, **parse_kw)
        if not pred:
            return PREDICTION_UNPARSED
        return VERIFIED if mv.verify(gold, pred, **verify_kw) else NOT_EQUAL
    except Exception:
        return NOT_EQUAL


def _squashed(text: str) -> str:
    return text.strip().replace(" ", "").replace("{", "").replace("}", "").replace(",", "")


def score_answer(prediction: Optional[str], gt_answer) -> float:
    """10 when math_verify finds ``prediction`` equal to ``gt_answer``; else, when the two match as text (spaces,
    braces and commas dropped), 5 if math_verify could not parse the prediction and 10 otherwise; else 0.
    A missing prediction or ground truth scores 0; a ground truth that is not a str is compared as its str()
    (ColossalChat raises on it)."""
    if prediction is None or gt_answer is None:
        return 0.0
    gold = gt_answer if isinstance(gt_answer, str) else str(gt_answer)
    status = verify_status(prediction, gold)
    if status == VERIFIED:
        return CORRECT_SCORE
    if _squashed(prediction) == _squashed(gold):
        return UNPARSED_MATCH_SCORE if status == PREDICTION_UNPARSED else CORRECT_SCORE
    return 0.0


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
