"""Rewards: rule-based reward functions by name, any user callable, and a learned reward-model scorer.

``get_reward_fn("boxed" | "think_answer_tags" | "toy_letter" | callable)`` returns a checked
``fn(responses, gt_answers, prompts) -> Tensor [N]``; `RewardModelScorer` scores token sequences. A run whose
``grpo_config['reward_fn_type']`` is one of ColossalChat's (``think_answer_tags``, ``boxed``, ``code``) scores with
`coati_relay.rewards.verifiable.VerifiableReward` instead: reward, format and answer accuracy, ColossalChat's length
rules.
"""
from coati_relay.rewards.math_rewards import (
                                              MathGrade,
                                              boxed_reward,
                                              extract_answer_tag,
                                              extract_boxed,
                                              grade_boxed,
                                              grade_think_answer,
                                              score_answer,
                                              soft_overlength_penalty,
                                              tags_valid,
                                              think_answer_reward,
)
from coati_relay.rewards.registry import RewardFn, get_reward_fn, register_reward, reward_names
from coati_relay.rewards.reward_model import RewardModelScorer
from coati_relay.rewards.toy_rewards import letter_fraction, toy_letter_reward

__all__ = [
    "MathGrade", "RewardFn", "RewardModelScorer", "boxed_reward", "extract_answer_tag", "extract_boxed",
    "get_reward_fn", "grade_boxed", "grade_think_answer", "letter_fraction", "register_reward",
    "reward_names", "score_answer", "soft_overlength_penalty", "tags_valid", "think_answer_reward",
    "toy_letter_reward",
]
