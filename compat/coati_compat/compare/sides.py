"""Runs one side of a comparison as a process of its own, on a fresh local Ray cluster (``RAY_ADDRESS=local``), so
that its start-up, its memory and its time are its own; stops it once it has made the steps asked for.

Stopping: SIGTERM to the side's process (Ray's driver shuts its cluster down on it), then, after a grace period,
SIGKILL to every process of its tree that is left. Every wait is bounded: the run by ``timeout_s``, the stop by
the grace period.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import psutil

from coati_compat import observers
from coati_compat.compare import recording_switch
from coati_compat.compare.process_memory import MemorySampler
from coati_compat.cpu_mode import patches as cpu_mode

logger = logging.getLogger(__name__)

POLL_S = 1.0
GRACE_S = 20.0


@dataclass
class SideRun:
    """How a side's process ended. ``stopped_at``: the steps it had made when it was stopped (None: it ended by
    itself); ``wall_s``: from its start to its end or its stop."""

    command: List[str]
    returncode: Optional[int]
    wall_s: float
    stopped_at: Optional[int]
    timed_out: bool
    log: str
    peak_memory_mib: Dict[str, float] = field(default_factory=dict)
    total_peak_memory_mib: float = 0.0

    @property
    def ok(self) -> bool:
        """It made its steps: it ended with status 0 or was stopped at the budget."""
        return not self.timed_out and (self.returncode == 0 or self.stopped_at is not None)

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def side_env(extra: Dict[str, str]) -> Dict[str, str]:
    """This process's environment for a side: a fresh local cluster, no CPU-mode or recording switches inherited
    (the caller adds the ones a side needs), Ray's worker logs kept apart by process."""
    env = {k: v for k, v in os.environ.items()
           if k not in (cpu_mode.ENV, recording_switch.ENV, observers.ENV, "RAY_ADDRESS")}
    env.update(RAY_ADDRESS="local", RAY_DEDUP_LOGS="0", HF_HUB_OFFLINE=env.get("HF_HUB_OFFLINE", "1"),
               TOKENIZERS_PARALLELISM=env.get("TOKENIZERS_PARALLELISM", "false"))
    env.update(extra)
    return env


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the side, then SIGKILL to what is left of its tree after `GRACE_S`."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=GRACE_S)
    for child in tree:
        try:
            child.kill()
        except psutil.Error:
            pass


def run_side(command: List[str], env: Dict[str, str], cwd: Path, log_path: Path,
             steps_made: Callable[[], int], budget: int, timeout_s: float) -> SideRun:
    """Runs ``command``; stops it once ``steps_made()`` reaches ``budget`` or after ``timeout_s``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logger.info("compare: running %s", " ".join(command))
    t0 = time.perf_counter()
    stopped_at, timed_out = None, False
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        sampler = MemorySampler(proc.pid)
        sampler.start()
        try:
            while proc.poll() is None:
                made = steps_made()
                if made >= budget:
                    stopped_at = made
                    break
                if time.perf_counter() - t0 > timeout_s:
                    timed_out = True
                    break
                time.sleep(POLL_S)
            wall_s = time.perf_counter() - t0
            if proc.poll() is None:
                _stop(proc)
        finally:
            sampler.stop()
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=GRACE_S)
    return SideRun(command=command, returncode=proc.returncode, wall_s=wall_s, stopped_at=stopped_at,
                   timed_out=timed_out, log=str(log_path), peak_memory_mib=dict(sampler.peaks_mib),
                   total_peak_memory_mib=sampler.total_peak_mib)
