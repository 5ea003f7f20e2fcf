"""Per-sample grading for evaluation during training: ColossalChat's rule rewards in ``eval_mode``.

ColossalChat judges an evaluation answer with the run's reward function and ``eval_mode=True``
(4f9953be3: ``reward/reward_fn.py``): the answer is extracted and checked whatever the format (training wants a valid
format first), no length rule applies, and a sample counts as correct when its answer matched (``ans_valid``).
`grade_for_eval` does that for the rule rewards of `coati_relay.rewards.verifiable` (their formats and
``response_format_tags``; "code" posts the program to the verifier). Any other reward (a user's function,
"toy_letter", a reward model) has no answer to extract: its reward is taken as is, and a sample counts as correct when
its reward is > 0, which for the rule rewards is the same test (they pay only for a correct answer).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from coati_relay.rewards.verifiable import ACC_SCORE, RULE_REWARDS, grade_code, grade_math


def _math(kind: str, text: str, gold: Any, tags) -> Dict[str, Any]:
    parsed, format_ok, score = grade_math(kind, text, gold, tags)
    return {"gold": gold, "parsed": parsed, "format_valid": float(format_ok), "ans_valid": float(score > 0),
            "reward": float(score)}


def _code(text: str, test_cases: Any, url: Optional[str]) -> Dict[str, Any]:
    g = grade_code(text, test_cases, url)
    return {"test_cases": g.test_cases, "test_results": g.results, "test_metadata": g.metadata, "parsed": g.program,
            "format_valid": float(g.format_ok), "ans_valid": float(g.passed), "reward": ACC_SCORE if g.passed else 0.0}


def grade_for_eval(reward: Any, responses: Sequence[str], targets: Sequence[Any], prompts: Sequence[str],
                   response_lengths: Sequence[int], rewards: Optional[torch.Tensor] = None,
                   tags: Optional[Mapping[str, Mapping[str, Any]]] = None,
                   code_verifier_api_url: Optional[str] = None) -> List[Dict[str, Any]]:
    """One record per response with ColossalChat's evaluation fields: ``prompt``, ``prediction`` (the response
    text), ``gold`` (code: ``test_cases``, ``test_results``, ``test_metadata``), ``parsed`` (the extracted answer or
    program; None without one), ``format_valid`` and ``ans_valid`` (1.0 or 0.0; None where the reward has no
    format), ``response_length`` (tokens), ``reward``.

    reward: the run's reward (a registered name or a callable); targets: each response's gt_answer (code: its
    test_cases); rewards: Tensor [N] of already computed rewards (a reward model's), used instead of ``reward``."""
    n = len(responses)
    if not (len(targets) == len(prompts) == len(response_lengths) == n):
        raise ValueError(f"grade_for_eval: {n} responses but {len(targets)} targets, {len(prompts)} prompts and "
                         f"{len(response_lengths)} lengths")
    kind = reward if isinstance(reward, str) and reward in RULE_REWARDS and rewards is None else None
    if kind == "code":
        graded = [_code(r, t, code_verifier_api_url) for r, t in zip(responses, targets)]
    elif kind is not None:
        graded = [_math(kind, r, t, tags) for r, t in zip(responses, targets)]
    else:
        if rewards is None:
            from coati_relay.rewards.registry import get_reward_fn

            rewards = get_reward_fn(reward)(list(responses), list(targets), list(prompts))
        graded = [{"gold": t, "parsed": None, "format_valid": None, "ans_valid": float(s > 0), "reward": float(s)}
                  for t, s in zip(targets, rewards.reshape(-1).tolist())]
    out = []
    for p, r, length, g in zip(prompts, responses, response_lengths, graded):
        record = {"prompt": p, "prediction": r, **g, "response_length": int(length)}
        out.append({k: record[k] for k in ("prompt", "prediction", *g, "response_length") if k in record})
    return out
