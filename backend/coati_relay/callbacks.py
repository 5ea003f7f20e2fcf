"""Run hooks: ``launch_distributed(callbacks=[...])``.

A callback is any object with one or more of these methods (the others may be absent):

- ``on_run_start(config)``: once, before any actor starts, with the checked `RunConfig`.
- ``on_round_end(step, metrics)``: after each round, with the record just written to ``metrics.jsonl`` (``step``,
  ``time`` and every metric, the very numbers of that line).
- ``on_checkpoint(step, path)``: after a checkpoint is written (at ``save_interval``, at the end, at an early stop).
- ``on_run_end(result)``: once, with the `RunResult`, after the run's actors are stopped.
- ``on_evaluate(step, results)``: after each evaluation during training (``eval_dataset_config``), with the run's
  step (the weight version evaluated) and the record just written to ``metrics.jsonl`` (``step``, ``time``,
  ``eval/{task}`` accuracy, ``eval/{task}/samples``, ``eval/training_step``: ColossalChat's optimizer step).

They run in the driver of a disaggregated run and in the one process of a colocated run, in the order of the list,
never in an actor (they need not be picklable). A hook that raises ends the run with `CallbackError` (a `RunFailed`
naming the callback's class and method); the run's actors are stopped on the way out.

Early stop: ``on_round_end`` (or ``on_checkpoint``) raises `StopRun`. The run then writes a checkpoint at that step
(unless one was just written), stops every role and returns normally; ``RunResult.stopped_early`` is True and
``RunResult.stopped_at`` is the step. With a hook that may stop the run (``on_round_end`` or ``on_checkpoint``), the
consumers of a disaggregated run wait for the driver's hooks after each round (up to a second a round) so that the
run can stop at exactly the step asked.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from coati_relay.observe.run_result import CallbackError

HOOKS = ("on_run_start", "on_round_end", "on_checkpoint", "on_evaluate", "on_run_end")
STOPPING_HOOKS = ("on_round_end", "on_checkpoint")  # where StopRun is honoured


class StopRun(Exception):
    """Raised by ``on_round_end`` or ``on_checkpoint`` to end the run cleanly at that step, with a checkpoint."""


def _name(callback: Any, hook: str) -> str:
    return f"{type(callback).__name__}.{hook}"


class Hooks:
    """Calls the callbacks' hooks in order. ``fail(message)`` turns a raising hook into the run's failure (it must
    raise); `StopRun` from a stopping hook sets ``stop_at``."""

    def __init__(self, callbacks: Sequence[Any], fail=None):
        self.callbacks = list(callbacks)
        self.fail = fail or _raise
        self.stop_at: Optional[int] = None

    def _call(self, hook: str, *args: Any, step: Optional[int] = None) -> None:
        for cb in self.callbacks:
            method = getattr(cb, hook, None)
            if method is None:
                continue
            try:
                method(*args)
            except StopRun:
                if hook in STOPPING_HOOKS and step is not None:
                    if self.stop_at is None:
                        self.stop_at = step
                    continue
                self.fail(f"callback {_name(cb, hook)} raised StopRun, which only on_round_end and on_checkpoint "
                          f"may raise")
            except Exception as exc:
                self.fail(f"callback {_name(cb, hook)} raised {type(exc).__name__}: {exc}")

    def run_start(self, config: Any) -> None:
        self._call("on_run_start", config)

    def round_end(self, step: int, record: Any, checkpoint: Optional[str] = None) -> bool:
        """Calls ``on_round_end``, then ``on_checkpoint`` when the round wrote ``checkpoint``; True when the run
        must stop."""
        self._call("on_round_end", step, record, step=step)
        if checkpoint:
            self._call("on_checkpoint", step, checkpoint, step=step)
        return self.stop_at is not None

    def checkpoint(self, step: int, path: str) -> None:
        self._call("on_checkpoint", step, path, step=step)

    def evaluate(self, step: int, results: Any) -> None:
        self._call("on_evaluate", step, results)

    def run_end(self, result: Any) -> None:
        self._call("on_run_end", result)


def _raise(message: str) -> None:
    raise CallbackError(message)
