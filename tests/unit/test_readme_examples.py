"""The README's short sections hold code a user pastes: the reward example registers and scores as it says, and every
page the README sends the reader to exists."""
from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def _block_after(text: str, marker: str) -> str:
    """The first fenced python block after ``marker``, its indentation removed."""
    start = text.index(marker)
    block = re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)
    indent = min(len(line) - len(line.lstrip()) for line in block.splitlines() if line.strip())
    return "\n".join(line[indent:] for line in block.splitlines())


def test_the_reward_example_registers_a_reward_that_scores_a_batch():
    from coati_relay.rewards import get_reward_fn
    from coati_relay.rewards.registry import _REWARDS

    code = _block_after(README.read_text(), "**Reward**")
    _REWARDS.pop("short_answer", None)
    try:
        exec(compile(code, "README.md", "exec"), {})
        scores = get_reward_fn("short_answer")(["7", "it is 8"], ["7", "7"], ["3 + 4?", "3 + 4?"])
    finally:
        _REWARDS.pop("short_answer", None)
    assert scores.shape == (2,) and scores.dtype == torch.float32
    assert scores[0] > scores[1]


def test_every_page_the_readme_names_exists():
    text = README.read_text()
    named = set(re.findall(r"`((?:docs|migration_guide|benchmarks|examples)/[\w./-]+)`", text))
    assert {"docs/engine.md", "docs/contributing.md", "benchmarks/README.md"} <= named
    missing = sorted(p for p in named if not (README.parent / p).exists())
    assert not missing, f"the README names pages that do not exist: {missing}"
