"""Per-step rows of both sides, in one shape: ``{"step", "reward", "reward_std", "kl", "actor_loss",
"critic_loss", "samples", "step_s", "samples_per_s", "push_s"}`` (None where a side has no such number).

A step is one weight version: on the legacy side, one episode of the trainers' ``fit`` (``update_steps`` batches,
replayed ``train_epochs`` times, then a push) or, for a script with its own actors, one round of experience then
losses; on the migrated side, one round of the engine (one line of ``metrics.jsonl``).

Legacy rows come from the recorded events (`coati_compat.compare.recording`):

- trainer runs (``train`` events): step k is episode k-1 of every trainer, complete once every trainer pushed;
  its losses are the means over its batches, its samples those of its first epoch, its push time the slowest
  trainer's. Experience is consumed first in, first out: the makers' batches, in the order they were made, fill
  the steps' sample counts, and give each step its reward (the reward model's score) and KL;
- scripts with their own actors (``loss`` events): in time order, a step ends where a process that made experience
  in it makes experience again after losses (another process may still make its share of the step's experience
  while the first learners run).

``step_s`` of step k is the time from the end of step k-1 to its end (step 1: from its first experience).
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from coati_compat.compare.verdicts import least_squares_slope
from coati_relay.parts import read_metrics

logger = logging.getLogger(__name__)

ROW_KEYS = ("step", "reward", "reward_std", "kl", "actor_loss", "critic_loss", "samples", "step_s",
            "samples_per_s", "push_s")


def read_events(directory: Path) -> List[Dict[str, Any]]:
    """Every event of every ``events-*.jsonl`` in ``directory`` (a cut-off line, a process killed mid-write, is
    skipped)."""
    events = []
    for path in sorted(Path(directory).glob("events-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("%s: skipping a cut-off line", path)
    return events


def _mean(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _moments(events: Sequence[Dict[str, Any]], prefix: str) -> Tuple[Optional[float], Optional[float]]:
    """(mean, std) over the samples of events that carry ``prefix_sum``/``prefix_sq_sum``."""
    n = sum(e["samples"] for e in events if f"{prefix}_sum" in e)
    if not n:
        return None, None
    total = sum(e[f"{prefix}_sum"] for e in events if f"{prefix}_sum" in e)
    squares = sum(e[f"{prefix}_sq_sum"] for e in events if f"{prefix}_sum" in e)
    mean = total / n
    return mean, math.sqrt(max(squares / n - mean * mean, 0.0))


def _row(step: int, experience: Sequence[Dict[str, Any]], actor: Sequence[float], critic: Sequence[float],
         samples: int, step_s: Optional[float], push_s: Optional[float]) -> Dict[str, Any]:
    reward, reward_std = _moments(experience, "reward")
    kl, _ = _moments(experience, "kl")
    return {"step": step, "reward": reward, "reward_std": reward_std, "kl": kl, "actor_loss": _mean(actor),
            "critic_loss": _mean(critic), "samples": samples, "step_s": step_s,
            "samples_per_s": samples / step_s if step_s else None, "push_s": push_s}


def _fifo(experience: List[Dict[str, Any]], counts: Sequence[int]) -> List[List[Dict[str, Any]]]:
    """The makers' batches (by end time) split over steps that consumed ``counts`` samples each; a batch goes to
    the step its first sample falls in."""
    out: List[List[Dict[str, Any]]] = [[] for _ in counts]
    bounds, total = [], 0
    for c in counts:
        total += c
        bounds.append(total)
    start, k = 0, 0
    for event in sorted(experience, key=lambda e: e["t1"]):
        while k < len(bounds) and start >= bounds[k]:
            k += 1
        if k == len(bounds):
            break
        out[k].append(event)
        start += event["samples"]
    return out


def _trainer_rows(events: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    trains = [e for e in events if e["event"] == "train"]
    pushes = [e for e in events if e["event"] == "push"]
    trainers = {e["pid"] for e in trains}
    episodes = []
    for episode in sorted({e["episode"] for e in trains}):
        done = [p for p in pushes if p["episode"] == episode]
        if {p["pid"] for p in done} != trainers:
            break  # the run stopped inside this episode
        episodes.append((episode, [e for e in trains if e["episode"] == episode], done))
    counts = [sum(e["samples"] for e in batch if e["epoch"] == 0) for _, batch, _ in episodes]
    experience = [e for e in events if e["event"] == "experience"]
    made = _fifo(experience, counts)
    start = min((e["t0"] for e in experience), default=min((e["t0"] for e in trains), default=0.0))
    rows = []
    for k, ((_, batch, done), exp) in enumerate(zip(episodes, made), start=1):
        end = max(p["t1"] for p in done)
        rows.append(_row(k, exp, [e.get("actor_loss") for e in batch], [e.get("critic_loss") for e in batch],
                         counts[k - 1], end - start, max(p["t1"] - p["t0"] for p in done)))
        start = end
    return rows


def _function_rows(events: List[Dict[str, Any]], finished: bool) -> List[Dict[str, Any]]:
    timed = sorted((e for e in events if e["event"] in ("experience", "loss")),
                   key=lambda e: e["t1"] if e["event"] == "experience" else e["t"])
    steps: List[List[Dict[str, Any]]] = []
    makers: set = set()  # processes that made experience in the current step
    after_loss = False
    for event in timed:
        if event["event"] == "experience" and (not steps or (after_loss and event["pid"] in makers)):
            steps.append([])
            makers, after_loss = set(), False
        if not steps:
            continue  # losses before any experience: nothing to pair them with
        steps[-1].append(event)
        if event["event"] == "experience":
            makers.add(event["pid"])
        after_loss = after_loss or event["event"] == "loss"
    if not finished and steps:
        steps = steps[:-1]  # the last one may still be running
    rows, start = [], None
    for k, step in enumerate(steps, start=1):
        experience = [e for e in step if e["event"] == "experience"]
        losses = [e for e in step if e["event"] == "loss"]
        if not losses:
            break
        start = min(e["t0"] for e in experience) if start is None else start
        end = max(e["t"] for e in losses)
        rows.append(_row(k, experience, [e["value"] for e in losses if e["which"] == "actor"],
                         [e["value"] for e in losses if e["which"] == "critic"],
                         sum(e["samples"] for e in experience), end - start, None))
        start = end
    return rows


def legacy_rows(directory: Path, finished: bool = True) -> List[Dict[str, Any]]:
    """The legacy side's rows from the events in ``directory``; ``finished``: the run has ended (else a step still
    running is left out)."""
    events = read_events(directory)
    if any(e["event"] == "train" for e in events):
        return _trainer_rows(events)
    return _function_rows(events, finished)


def migrated_rows(run_dir: Path) -> List[Dict[str, Any]]:
    """The migrated side's rows from the engine's ``metrics.jsonl`` in ``run_dir`` (none before the first step)."""
    if not (Path(run_dir) / "metrics.jsonl").is_file():
        return []

    def number(record: Dict[str, Any], key: str) -> Optional[float]:
        value = record.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    return [{"step": int(r["step"]), "reward": number(r, "reward"), "reward_std": None, "kl": number(r, "kl"),
             "actor_loss": number(r, "loss"), "critic_loss": number(r, "value_loss"),
             "samples": int(r.get("samples") or 0), "step_s": number(r, "round_s"),
             "samples_per_s": number(r, "samples_per_s"), "push_s": number(r, "weight_sync_s")}
            for r in read_metrics(run_dir)]


def summarize(rows: Sequence[Dict[str, Any]], wall_s: float, peak_memory_mib: float) -> Dict[str, Any]:
    """A side's headline numbers: steps; s/step and samples/s over steps 2.. (step 1 holds the warm-up; step 1
    alone when there is no other); whole-run time; weight push s/step; peak memory; final reward (the mean of the
    last quarter of the steps, at least one); reward slope (least squares, per step)."""
    steady = list(rows[1:]) or list(rows)
    timed = [r for r in steady if r["step_s"]]
    rewards = [r["reward"] for r in rows if r["reward"] is not None and math.isfinite(r["reward"])]
    tail = rewards[-max(1, math.ceil(len(rewards) / 4)):] if rewards else []
    return {
        "steps": len(rows),
        "s_per_step": _mean([r["step_s"] for r in timed]),
        "samples_per_s": (sum(r["samples"] for r in timed) / sum(r["step_s"] for r in timed)) if timed else None,
        "whole_run_s": wall_s,
        "push_s": _mean([r["push_s"] for r in rows]),
        "peak_memory": peak_memory_mib or None,
        "final_reward": _mean(tail),
        "reward_slope": least_squares_slope(rewards),
    }
