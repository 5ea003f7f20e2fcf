"""The rollout log: producer 0's samples, one JSON line per logged rollout (ColossalChat's ``rollout_log_file``).

Each line: ``{"train_step": int, "rollout": [prompt + first response, decoded, per prompt], "prompts": [...],
"responses": [first response per prompt], "rewards": [its reward], "weight_version": int}``. ``train_step`` and
``rollout`` are ColossalChat's fields; ``prompts``, ``responses``, ``rewards`` and ``weight_version`` are this
engine's additions (ColossalChat writes before scoring). A rollout is logged when its optimizer step is due
(`coati_relay.observe.evaluation.is_due`): the first one, then every ``log_rollout_interval`` steps; evaluation
rollouts never.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from coati_relay.config.schema import RolloutLogSettings
from coati_relay.observe.evaluation import is_due


class RolloutLog:
    def __init__(self, settings: RolloutLogSettings):
        self.path = Path(settings.path)
        self.interval = settings.interval
        self.last_step = -1
        if self.path.exists():
            raise ValueError(f"rollout log {self.path} already exists; delete it or pass another rollout_save_dir")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()

    def due(self, training_step: int) -> bool:
        return is_due(training_step, self.last_step, self.interval)

    def write(self, training_step: int, weight_version: int, rollout: List[str], prompts: List[str],
              responses: List[str], rewards: List[float]) -> Dict[str, Any]:
        """Appends one record (one entry per prompt: its first response; ``rollout``: prompt and response decoded
        as one sequence) and returns it."""
        record = {"train_step": training_step, "rollout": rollout,
                  "prompts": prompts, "responses": responses, "rewards": [float(x) for x in rewards],
                  "weight_version": weight_version}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.last_step = training_step
        return record
