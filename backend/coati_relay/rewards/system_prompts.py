"""System prompts that go with the rule-based rewards.

`DEFAULT_SYSTEM_PROMPT` is the system message of every prompt of a ``train_dataset_config['path']`` dataset whose
``system_prompt`` is None, as ColossalChat gives such prompts its default math prompt
(``coati/dataset/loader.py:apply_chat_template_and_mask`` at 4f9953be3). It asks for the same format (reasoning in
``<think> </think>``, then the bare final answer in ``<answer> </answer>``), the one the ``think_answer_tags`` reward
scores, in this project's own words: the tokens differ from ColossalChat's default, so a run that must see the very
same prompt tokens on both engines passes its ``system_prompt`` explicitly (the migration guide's contract table
lists this deviation).
"""
from __future__ import annotations

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant who solves math problems step by step. First reason about the problem inside "
    "<think> </think> tags. Then give only the final answer, with no explanation, inside <answer> </answer> tags. "
    "The reply looks like: <think> the reasoning </think><answer> 42 </answer>.\n\n"
)
