"""Ctrl-C (SIGINT) and SIGTERM during a run: one message that says where the run stopped and how to continue it.

`StopOnSignal` turns the first signal into a request the colocated loop reads at the end of each round (it saves a
checkpoint there and stops); a second signal stops at once. `RunInterrupted` is what `launch_distributed` raises
either way: a `KeyboardInterrupt` whose message names the step, the latest checkpoint and the ``resume_from`` to pass.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Optional, Union

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by a signal; ``step`` the last training step logged, ``checkpoint`` the latest complete
    checkpoint (None: none), ``resume_from`` the directory to pass as ``resume_from`` (None where there is none)."""

    def __init__(self, step: Optional[int], checkpoint: Optional[Path], resume_from: Optional[Path]):
        self.step, self.checkpoint, self.resume_from = step, checkpoint, resume_from
        where = "before its first step" if step is None else f"at step {step}"
        if checkpoint is None:
            tail = "latest checkpoint: none (the run starts afresh when run again)"
        else:
            tail = f"latest checkpoint {checkpoint}; resume with resume_from={resume_from}"
        super().__init__(f"stopped {where}; {tail}")


def interrupted(run_dir: Union[str, os.PathLike], save_dir: Union[str, os.PathLike]) -> RunInterrupted:
    """The `RunInterrupted` of a run that logs to ``run_dir`` and saves under ``save_dir``, read from its files: the
    step is the later of the last one ``metrics.jsonl`` logged and the latest complete checkpoint's (consumers may
    save a step the driver has not logged yet)."""
    from coati_relay.checkpoint import load_checkpoint, resolve_checkpoint
    from coati_relay.observe.evaluation import training_records
    from coati_relay.observe.metrics import read_metrics

    try:
        steps = [int(r["step"]) for r in training_records(read_metrics(run_dir))]
    except (FileNotFoundError, ValueError):
        steps = []
    try:
        checkpoint = resolve_checkpoint(save_dir)
        steps.append(int(load_checkpoint(checkpoint, {})["step"]))
    except (FileNotFoundError, ValueError):
        return RunInterrupted(max(steps, default=None), None, None)
    return RunInterrupted(max(steps), checkpoint, Path(save_dir))


class StopOnSignal:
    """Once installed (in the main thread; elsewhere it does nothing): the first SIGINT or SIGTERM sets ``requested``
    and says what happens next; a second one raises `KeyboardInterrupt` at once. `restore` puts back the handlers
    it found."""

    def __init__(self, what: str):
        self.what = what  # what the run does before it stops, for the message
        self.requested = False
        self._saved: dict = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("%s received: %s, then stopping (again to stop at once)", signal.Signals(signum).name, self.what)

    def install(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()
