"""Readers of what a run's trackers wrote, for comparing it with ``metrics.jsonl``: each gives step ->
{metric: value}."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

Steps = Dict[int, Dict[str, Any]]


def jsonl_steps(run_dir: Path) -> Steps:
    """step -> {metric: value} of ``metrics.jsonl`` (read as JSON, not with the engine's reader)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out[record["step"]] = {k: math.nan if v is None else v for k, v in record.items() if k not in ("step", "time")}
    return out


def tensorboard_steps(log_dir: Path) -> Steps:
    """step -> {tag: value} of the scalars in the event files under ``log_dir``, read by tensorboard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    out: Steps = {}
    for tag in acc.Tags()["tensors"]:
        for event in acc.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto)
            if value.dtype.kind == "f":  # the run config is a text tensor
                assert tag not in out.get(event.step, {}), f"{tag} logged twice at step {event.step}"
                out.setdefault(event.step, {})[tag] = value.item()
    return out


def wandb_records(wandb_dir: Path) -> list:
    """The records of the one offline W&B run under ``wandb_dir``, as ``wandb leet inspect --json`` prints them."""
    runs = sorted(wandb_dir.glob("offline-run-*"))
    assert len(runs) == 1, f"expected one offline W&B run in {wandb_dir}, found {runs}"
    cli = Path(sys.executable).with_name("wandb")
    text = subprocess.run([str(cli), "leet", "inspect", "--json", str(runs[0])], capture_output=True, text=True,
                          check=True, timeout=120).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wandb_steps(records: list) -> Steps:
    out: Steps = {}
    for rec in records:
        if rec["type"] == "history":
            item = rec["history"]["item"]
            step = rec["history"]["step"]["num"]
            assert step not in out, f"W&B history has step {step} twice"
            out[step] = {k: (math.nan if v == "NaN" else v) for k, v in item.items() if not k.startswith("_")}
    return out


def same(got: Steps, want: Steps) -> bool:
    """The same steps, each with the same metric names and equal values (NaN equal to NaN)."""
    return got.keys() == want.keys() and all(
        got[s].keys() == want[s].keys()
        and all(g == w or (math.isnan(g) and math.isnan(w)) for g, w in ((got[s][k], want[s][k]) for k in want[s]))
        for s in want)
