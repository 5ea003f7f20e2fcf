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

from typing import Any, List, Optional, Sequence

from coati_relay.config.keys import closest
from coati_relay.observe.run_result import CallbackError

HOOKS = ("on_run_start", "on_round_end", "on_checkpoint", "on_evaluate", "on_run_end")
STOPPING_HOOKS = ("on_round_end", "on_checkpoint")  # where StopRun is honoured


class StopRun(Exception):
    """Raised by ``on_round_end`` or ``on_checkpoint`` to end the run cleanly at that step, with a checkpoint."""


def _name(callback: Any, hook: str) -> str:
    return f"{type(callback).__name__}.{hook}"


def check_callbacks(errors: List[str], callbacks: Any) -> tuple:
    """``callbacks`` as a tuple; each problem appended to ``errors``: not a list, an object without a hook method,
    a method whose name is close to a hook's (``on_round_ended``: did you mean 'on_round_end'?)."""
    if callbacks is None:
        return ()
    if not isinstance(callbacks, (list, tuple)):
        errors.append(f"callbacks must be a list of objects with hook methods {list(HOOKS)}, "
                      f"got {type(callbacks).__name__}")
        return ()
    for i, cb in enumerate(callbacks):
        where = f"callbacks[{i}] ({type(cb).__name__})"
        if isinstance(cb, type):
            errors.append(f"{where} is a class; pass an instance of it")
            continue
        found = [h for h in HOOKS if callable(getattr(cb, h, None))]
        misspelt = 0
        for attr in sorted(a for a in dir(cb) if a.startswith("on_") and a not in HOOKS):
            hint = closest(attr, HOOKS)
            if hint:
                misspelt += 1
                errors.append(f"{where} has a method {attr!r}, which is no hook{hint}")
        for h in HOOKS:
            if hasattr(cb, h) and not callable(getattr(cb, h)):
                errors.append(f"{where}.{h} must be a method, got {type(getattr(cb, h)).__name__}")
        if not found and not misspelt:
            errors.append(f"{where} has none of the hook methods {list(HOOKS)}")
    return tuple(callbacks)


def may_stop(callbacks: Sequence[Any]) -> bool:
    """True when a callback has a hook that may ask the run to stop."""
    return any(callable(getattr(cb, h, None)) for cb in callbacks for h in STOPPING_HOOKS)


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
