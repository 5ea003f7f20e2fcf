"""What a run ends with: `RunResult`, which `launch_distributed` returns from a run on Ray (`coati_relay.launch`) or
one colocated in the driver's process (`coati_relay.roles.colocated`), or `RunFailed` (and `CallbackError`), which it
raises."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional


class RunFailed(RuntimeError):
    """A role died or timed out; the message names it, and ``counters`` holds the queue's accounting."""

    def __init__(self, message: str, counters: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.counters = counters or {}


class CallbackError(RunFailed):
    """A callback's hook raised (`coati_relay.callbacks`); the message names its class and method."""


@dataclass
class RunResult:
    history: List[Dict[str, Any]]  # each round's record, in order
    checkpoints: List[str]
    run_dir: Path
    summary: Dict[str, Any]
    counters: Dict[str, Any]
    producer_stats: List[Dict[str, Any]] = field(default_factory=list)
    # each consumer rank's end: rounds trained, and ``weights_digest`` (sum and absolute sum of its policy's weights
    # in float64; None where the plugin shards them), equal on every rank of a data-parallel group
    consumer_stats: List[Dict[str, Any]] = field(default_factory=list)
    setup_s: float = 0.0
    nodes: Dict[str, str] = field(default_factory=dict)  # role or service ("producer-0", "weight-store") -> node id
    # (empty in a colocated run, which has no Ray nodes)
    stopped_early: bool = False  # a callback raised StopRun (`coati_relay.callbacks`)
    stopped_at: Optional[int] = None  # the step it stopped at, where its last checkpoint is
    export_dir: Optional[Path] = None  # the final policy as a Hugging Face model directory (None: not exported)
    trackers: Dict[str, str] = field(default_factory=dict)  # report_to's trackers that started -> where they wrote

    def report(self) -> str:
        """A short end-of-run table: run directory, steps, reward start -> end, wall time, checkpoints, export and
        where each tracker wrote."""
        s = self.summary

        def num(v: Any) -> str:  # three decimals, three significant digits below 0.01
            return "-" if v is None else f"{v:.3g}" if v and abs(v) < 1e-2 else f"{v:.3f}"

        wall = s.get("wall_s")
        rows = [("run dir", str(self.run_dir)), ("steps", str(s.get("steps", len(self.history)))),
                ("reward", f"{num(s.get('reward_start'))} -> {num(s.get('reward_end'))}"),
                ("wall time", "-" if wall is None else f"{wall:.1f}s (+{self.setup_s:.1f}s set-up)")]
        if self.checkpoints:
            rows.append(("checkpoints", f"{Path(self.checkpoints[-1]).parent} (latest: "
                                        f"{Path(self.checkpoints[-1]).name})"))
        rows.append(("exported model", "-" if self.export_dir is None else str(self.export_dir)))
        rows += list(self.trackers.items())
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
