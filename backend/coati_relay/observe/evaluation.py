"""Evaluation during training (ColossalChat's producer-side evaluation).

Producers evaluate: before generating with weights of a new version, a producer whose optimizer step (ColossalChat's
``consumer_global_step``, `RunConfig.training_step`) is due (`is_due`: the first weights it works with,
then every ``eval_interval`` steps) generates for its share of every task's prompts with the evaluation sampling,
grades each response (`coati_relay.rewards.eval_grading`) and appends the records to
``eval_save_dir/{task}_training_step_{step}.jsonl`` (one JSON object a line, under a file lock: every producer adds
its share to the same file). Shares are ColossalChat's ``DistributedSampler(shuffle=False, drop_last=False)``: prompt
``i`` of the padded list goes to producer ``i % num_producers``, the list padded with its first prompts to a multiple
of the producers. The driver sums (correct, total) over producers (`EvalAggregator`) and logs
``eval/{task}`` = correct / total at the run's step (the weight version).
"""
from __future__ import annotations

import fcntl
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from coati_relay.config.schema import EvalSettings

log = logging.getLogger(__name__)

EVAL_KIND = "eval"  # the ``kind`` of an evaluation report among the queue's step reports
STEP_KEY = "eval/training_step"


def is_due(step: int, last: int, interval: int) -> bool:
    """ColossalChat's test: the first time (``last == -1``), then once ``step`` is ``interval`` steps past ``last``;
    with ``interval <= 0`` every time."""
    return last == -1 or (step - last >= interval and (interval <= 0 or step > last))


def accuracy(correct: float, total: float) -> float:
    return correct / total if total else math.nan


def eval_file(save_dir: Path, task: str, training_step: int) -> Path:
    """ColossalChat's file of one task at one step."""
    return Path(save_dir) / f"{task}_training_step_{training_step}.jsonl"


def shard_indices(num_items: int, num_shards: int, shard: int) -> List[int]:
    """The items of ``shard``: ``range(num_items)`` padded with its first items to a multiple of ``num_shards``,
    then every ``num_shards``-th from ``shard`` (torch's DistributedSampler without shuffling or dropping)."""
    if num_items <= 0 or not 0 <= shard < num_shards:
        raise ValueError(f"shard_indices: need num_items > 0 and 0 <= shard < num_shards, got {num_items}, "
                         f"{shard}, {num_shards}")
    total = math.ceil(num_items / num_shards) * num_shards
    padded = [i % num_items for i in range(total)]
    return padded[shard::num_shards]


def append_jsonl_locked(path: Path, records: Iterable[Dict[str, Any]]) -> None:
    """Appends one JSON line per record to ``path`` (parents created) while holding an exclusive lock on the file
    itself, so that writers in other processes do not interleave."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Evaluator:
    """One producer's evaluation: its share of each task, loaded once; `maybe_run` evaluates when due.

    ``generate_and_grade(prompt_ids, info) -> records`` is the producer's: it generates with the evaluation
    sampling and grades (`ProducerWorker._eval_batch`)."""

    def __init__(self, settings: EvalSettings, tokenizer: Any, index: int, num_producers: int, batch_size: int):
        from coati_relay.prompts import load_prompts

        self.settings = settings
        self.batch_size = max(1, batch_size)
        self.last_step = -1
        self.shards: Dict[str, Tuple[List[List[int]], Dict[str, List[Any]]]] = {}
        for name, task in settings.tasks.items():
            ds = load_prompts(task.dataset, tokenizer, max_prompt_tokens=task.max_prompt_tokens,
                              system_prompt=task.system_prompt)
            idx = shard_indices(len(ds), num_producers, index)
            self.shards[name] = ([ds.prompt_ids[i] for i in idx], {k: [v[i] for i in idx] for k, v in ds.info.items()})

    def due(self, training_step: int) -> bool:
        return is_due(training_step, self.last_step, self.settings.interval)

    def run(self, training_step: int, generate_and_grade) -> Dict[str, Tuple[float, int]]:
        """Evaluates every task now; writes each task's records; returns task -> (correct, total) of this share."""
        out: Dict[str, Tuple[float, int]] = {}
        for name, (prompt_ids, info) in self.shards.items():
            records: List[Dict[str, Any]] = []
            for start in range(0, len(prompt_ids), self.batch_size):
                batch = slice(start, start + self.batch_size)
                records += generate_and_grade(prompt_ids[batch], {k: v[batch] for k, v in info.items()})
            append_jsonl_locked(eval_file(self.settings.save_dir, name, training_step), records)
            out[name] = (sum(max(0.0, r["ans_valid"]) for r in records), len(records))
            log.info("evaluation at training step %d: %s %.4f (%d samples of this producer)", training_step, name,
                     accuracy(*out[name]), len(records))
        self.last_step = training_step
        return out


def eval_metrics(training_step: int, counts: Dict[str, Tuple[float, int]]) -> Dict[str, float]:
    """The metrics of one evaluation: ``eval/{task}`` (accuracy), ``eval/{task}/samples`` and the step."""
    metrics: Dict[str, float] = {STEP_KEY: training_step}
    for task, (correct, total) in counts.items():
        metrics[f"eval/{task}"] = accuracy(correct, total)
        metrics[f"eval/{task}/samples"] = total
    return metrics


def training_records(history: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The metrics records of training rounds (evaluation records left out)."""
    return [r for r in history if STEP_KEY not in r]


class EvalAggregator:
    """The driver's sum over producers: `add` takes one producer's report (``{"kind": "eval", "producer",
    "step", "training_step", "counts": {task: [correct, total]}}``) and returns ``(step, metrics)`` once every
    expected producer has reported that step, else None; `flush` returns the incomplete ones (a producer that
    skipped that version or died), each with a warning."""

    def __init__(self, num_producers: int):
        self.num_producers = num_producers
        self.pending: Dict[int, Dict[str, Any]] = {}

    def add(self, report: Dict[str, Any]) -> Optional[Tuple[int, Dict[str, float]]]:
        step = int(report["step"])
        entry = self.pending.setdefault(step, {"training_step": int(report["training_step"]), "producers": set(),
                                               "counts": {}})
        entry["producers"].add(report["producer"])
        for task, (correct, total) in report["counts"].items():
            c, t = entry["counts"].get(task, (0.0, 0))
            entry["counts"][task] = (c + correct, t + total)
        if len(entry["producers"]) < self.num_producers:
            return None
        del self.pending[step]
        return step, eval_metrics(entry["training_step"], entry["counts"])

    def flush(self) -> List[Tuple[int, Dict[str, float]]]:
        out = []
        for step in sorted(self.pending):
            entry = self.pending.pop(step)
            log.warning("evaluation at step %d: only producers %s of %d evaluated (the others skipped that weight "
                        "version or died); its accuracy covers their shares only", step, sorted(entry["producers"]),
                        self.num_producers)
            out.append((step, eval_metrics(entry["training_step"], entry["counts"])))
        return out
