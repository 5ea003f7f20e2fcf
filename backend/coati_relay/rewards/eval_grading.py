"""Per-sample grading for evaluation during training: ColossalChat's reward functions in ``eval_mode``.

ColossalChat judges an evaluation answer by the run's reward function with ``eval_mode=True``: the answer is
extracted and compared with ``gt_answer`` whatever the format (training requires a valid format first), and no
length penalty applies; a sample counts as correct when its answer matched (``ans_valid``). For the math rewards
("boxed", "think_answer_tags") that is what `grade_for_eval` does. Any other reward (a user's function, "toy_letter",
a reward model) has no answer to extract: its reward is taken as is, and a sample counts as correct when its reward
is > 0, which for ColossalChat's math rewards is the same test (they pay only for a correct answer).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from coati_relay.rewards.math_rewards import extract_answer_tag, extract_boxed, score_answer, tags_valid

_EXTRACT: Dict[str, Callable[[str], Optional[str]]] = {"boxed": extract_boxed,
                                                        "think_answer_tags": extract_answer_tag}
_FORMAT: Dict[str, Callable[[str], bool]] = {"boxed": lambda r: extract_boxed(r) is not None,
                                             "think_answer_tags": tags_valid}


def grade_for_eval(reward: Any, responses: Sequence[str], gt_answers: Sequence[Any], prompts: Sequence[str],
                   response_lengths: Sequence[int], rewards: Optional[torch.Tensor] = None) -> List[Dict[str, Any]]:
    """One record per response, with ColossalChat's evaluation fields: ``prompt``, ``prediction`` (the response
    text), ``gold``, ``parsed`` (the extracted answer; None without one), ``format_valid`` and ``ans_valid`` (1.0 or
    0.0), ``response_length`` (tokens), ``reward``.

    reward: the run's reward (a registered name or a callable); rewards: Tensor [N] of already computed rewards
    (a reward model's), used instead of calling ``reward`` when it has no answer extraction."""
    n = len(responses)
    if not (len(gt_answers) == len(prompts) == len(response_lengths) == n):
        raise ValueError(f"grade_for_eval: {n} responses but {len(gt_answers)} gt_answers, {len(prompts)} prompts "
                         f"and {len(response_lengths)} lengths")
    name = reward if isinstance(reward, str) else None
    if name in _EXTRACT:
        parsed = [_EXTRACT[name](r) for r in responses]
        scores = [score_answer(p, gt) for p, gt in zip(parsed, gt_answers)]
        formats = [float(_FORMAT[name](r)) for r in responses]
    else:
        if rewards is None:
            from coati_relay.rewards.registry import get_reward_fn

            rewards = get_reward_fn(reward)(list(responses), list(gt_answers), list(prompts))
        scores = [float(x) for x in rewards.reshape(-1).tolist()]
        parsed, formats = [None] * n, [None] * n
    return [{"prompt": p, "prediction": r, "gold": gt, "parsed": pa, "format_valid": f,
             "ans_valid": 1.0 if s > 0 else 0.0, "response_length": int(length), "reward": float(s)}
            for p, r, gt, pa, f, s, length in zip(prompts, responses, gt_answers, parsed, formats, scores,
                                                  response_lengths)]
