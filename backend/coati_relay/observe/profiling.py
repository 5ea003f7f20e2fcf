"""``enable_profiling``: the phase timings of each role per round, and a torch profiler trace.

ColossalChat's ``CustomProfiler`` (coati/distributed/profiling_utils.py at 4f9953be3) writes one ``{P,C}{index}.prof``
text file per role, with a line at the enter and the exit of each phase: the consumer's ``sync_model``,
``rollout_episode_E_step_S`` (a whole update), ``recv_broadcast_data_P{r}`` and ``step``; the producer's
``sync_model``, ``rollout``, ``calculate_reward`` and ``send_broadcast_data``. Here each role writes one JSON line
per phase it went through, into ``run_dir/profile/<role>.jsonl``::

    {"role": "consumer-0", "round": 3, "phase": "step", "start": 1764300000.1, "seconds": 0.42, "pid": 1234}

The phases: consumer ``receive`` (waiting for the round's rollouts), ``step`` (training on them), ``sync_model``
(publishing the next weight version), ``save`` (a checkpoint); producer ``sync_model`` (waiting for and loading
weights), ``rollout`` (generation), ``calculate_reward`` and ``send`` (the queue put). Consumer rank 0 also records
a torch profiler trace of its first `TRACE_ROUNDS` rounds to ``run_dir/profile/consumer-0.trace.json`` (Chrome
trace format; open it in chrome://tracing or Perfetto), where torch's profiler can run; where it cannot, the
timings are still written and the reason is logged once.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Union

log = logging.getLogger(__name__)

PROFILE_DIR = "profile"
TRACE_ROUNDS = 2


class PhaseProfiler:
    """Phase timings of one role, appended to ``run_dir/profile/<role>.jsonl``; does nothing when not enabled
    (``run_dir`` may then be None).

    ``trace``: also record a torch profiler trace of the first `TRACE_ROUNDS` rounds (`round_started`)."""

    def __init__(self, run_dir: Optional[Union[str, os.PathLike]], role: str, enabled: bool,
                 trace: bool = False) -> None:
        self.enabled, self.role = bool(enabled), role
        self.path: Optional[Path] = None
        self.trace_path: Optional[Path] = None
        self._file = None
        self._torch_profiler: Any = None
        self._traced_rounds = 0
        if not self.enabled:
            return
        folder = Path(run_dir) / PROFILE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{role}.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")
        if trace:
            self._start_trace(folder / f"{role}.trace.json")

    def _start_trace(self, path: Path) -> None:
        try:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            import torch

            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._torch_profiler = profile(activities=activities, record_shapes=False)
            self._torch_profiler.__enter__()
            self.trace_path = path
        except Exception as exc:  # a profiler another tool holds, a build without it: timings still run
            self._torch_profiler = None
            log.warning("%s: torch profiler unavailable (%s: %s); only phase timings are written", self.role,
                        type(exc).__name__, exc)

    @contextlib.contextmanager
    def phase(self, name: str, round_: int) -> Iterator[None]:
        """Times the block as phase ``name`` of round ``round_`` (a line is written even when the block raises)."""
        if not self.enabled:
            yield
            return
        start, t0 = time.time(), time.perf_counter()
        try:
            yield
        finally:
            self.record(name, round_, start, time.perf_counter() - t0)

    def record(self, name: str, round_: int, start: float, seconds: float) -> None:
        """One phase line: ``start`` (epoch seconds) and its duration."""
        if self._file is None:
            return
        self._file.write(json.dumps({"role": self.role, "round": int(round_), "phase": name, "start": start,
                                     "seconds": seconds, "pid": os.getpid()}) + "\n")
        self._file.flush()

    def round_finished(self) -> None:
        """Ends the torch trace after `TRACE_ROUNDS` rounds and writes it."""
        if self._torch_profiler is None:
            return
        self._traced_rounds += 1
        if self._traced_rounds >= TRACE_ROUNDS:
            self._stop_trace()

    def _stop_trace(self) -> None:
        prof, self._torch_profiler = self._torch_profiler, None
        try:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(str(self.trace_path))
        except Exception as exc:
            log.warning("%s: the torch profiler trace could not be written (%s: %s)", self.role, type(exc).__name__,
                        exc)
            self.trace_path = None

    def close(self) -> None:
        """Writes a trace still running and closes the timings file."""
        if self._torch_profiler is not None:
            self._stop_trace()
        if self._file is not None:
            self._file.close()
            self._file = None
