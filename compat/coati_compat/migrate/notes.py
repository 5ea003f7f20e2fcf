"""The ``# NOTE:`` comments of a migrated script: one topic per legacy concept, each with an anchor in the guide.

``TOPICS`` is the one table: a test checks that ``migration_guide/rewriter.md`` has an anchor for every topic. A
NOTE points to its section with the command that prints it where the user works, ``coati-relay docs TOPIC``
(`coati_relay.migration.guide`); ``Note.link`` is the page and anchor in this repository (what compare reports cite).
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import List, Optional

GUIDE_PAGE = "migration_guide/rewriter.md"

TOPICS = {
    "routing": "maker/trainer names and routing",
    "placement": "actor options and Ray start-up",
    "env-info": "env_info and process groups",
    "maker-strategy": "the maker's strategy",
    "trainer-strategy": "the trainer's strategy",
    "models": "model factories and checkpoints",
    "initial-model": "the initial (reference) model",
    "lora": "LoRA",
    "learning-rate": "learning rate",
    "kl-and-advantages": "KL coefficient and advantages",
    "generation": "generation keywords",
    "batch-sizes": "batch sizes and rounds",
    "run-length": "how long a run is",
    "train-epochs": "train_epochs",
    "buffer": "replay buffer settings",
    "initial-sync": "the initial weight sync",
    "callbacks": "callbacks, performance evaluators, debug",
    "trackers": "TensorBoard and Weights & Biases",
    "dataset": "prompt data",
    "custom-classes": "subclasses of legacy classes",
    "four-role": "four-role scripts (own Ray actors for policy, critic, reference, reward)",
    "unused-flags": "command-line flags without effect",
    "seed-and-save-dir": "--seed and --save_dir",
    "unread": "values the rewriter could not read",
    "ppo-to-grpo": "PPO becomes the GRPO family (--target colossalchat)",
    "rewards": "the reward model becomes a rule-based reward (--target colossalchat)",
}


@dataclass
class Note:
    """One NOTE. key: the launch keyword it sits above in the migrated script (None: the module's header)."""

    topic: str
    text: str
    key: Optional[str] = None
    line: int = 0

    def __post_init__(self) -> None:
        if self.topic not in TOPICS:
            raise ValueError(f"unknown NOTE topic {self.topic!r}; add it to TOPICS (and an anchor to {GUIDE_PAGE})")

    @property
    def link(self) -> str:
        return f"{GUIDE_PAGE}#{self.topic}"

    @property
    def command(self) -> str:
        """The command that prints this NOTE's section of the guide."""
        return f"coati-relay docs {self.topic}"

    def comment(self, indent: str = "", width: int = 116) -> List[str]:
        """The NOTE as comment lines: ``# NOTE: <text> (legacy line N) (`coati-relay docs TOPIC`)``."""
        where = f" (legacy line {self.line})" if self.line else ""
        command = f"(`{self.command}`)".replace(" ", "\0")  # one word: never split over two lines
        body = f"{self.text}{where} {command}"
        lines = [line.replace("\0", " ") for line in textwrap.wrap(body, width=width - len(indent) - 8,
                                                                     break_on_hyphens=False, break_long_words=False)]
        return [f"{indent}# NOTE: {lines[0]}"] + [f"{indent}#       {line}" for line in lines[1:]]
