"""System prompts that go with the rule-based rewards.

`DEFAULT_SYSTEM_PROMPT` is ColossalChat's default (``coati/dataset/loader.py:apply_chat_template_and_mask`` at
4f9953be3): the system message of every prompt of a ``train_dataset_config['path']`` dataset whose
``system_prompt`` is None. It asks for the think/answer tag format that the ``think_answer_tags`` reward scores.
The text is kept verbatim, so that the same dataset gives the same prompt tokens there and here.
"""
from __future__ import annotations

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within <think> </think> and"
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
    "</answer>. Now the user asks you to solve a math problem that involves reasoning. After thinking, when you "
    "finally reach a conclusion, clearly output the final answer without explanation within the <answer> </answer> "
    "tags, i.e., <answer> 123 </answer>.\n\n"
)
