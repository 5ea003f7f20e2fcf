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
    history: List[Dict[str, Any]]
    checkpoints: List[str]
    run_dir: Path
    summary: Dict[str, Any]
    counters: Dict[str, Any]
    producer_stats: List[Dict[str, Any]] = field(default_factory=list)
    setup_s: float = 0.0
    nodes: Dict[str, str] = field(default_factory=dict)  # role or service ("producer-0", "weight-store") -> node id
    # (empty in a colocated run, which has no Ray nodes)
    stopped_early: bool = False  # a callback raised StopRun (`coati_relay.callbacks`)
    stopped_at: Optional[int] = None  # the step it stopped at, where its last checkpoint is
