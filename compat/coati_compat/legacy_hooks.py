"""A legacy ``coati.ray`` callback object run as an engine hook (`coati_relay.callbacks`).

``launch_distributed(callbacks=[LegacyHook(MyTrainerCallback(...))])`` calls the legacy methods whose moment
exists in the engine:

==============================  ==========================  ===================================================
legacy method                   engine hook                 arguments it gets
==============================  ==========================  ===================================================
on_fit_start / on_loop_start    on_run_start(config)        none
on_batch_end(metrics, exp)      on_round_end(step, record)  the round's metrics (``metrics``: renamed), None
on_update_end                   on_round_end, after it      none (a round ends with the new weights published)
on_fit_end / on_loop_end        on_run_end(result)          none
==============================  ==========================  ===================================================

The others (``on_episode_*``, ``on_epoch_*``, ``on_batch_start``, ``on_update_start``, a maker's
``on_make_experience_*``, ``on_send_*``, ``on_batch_*``) have no moment: the engine's rounds are not split into
them, and the makers' work happens in producer actors, where no hook runs. A callback that overrides one of them
gets a warning naming the closest hook (``on_round_end``), once, when it is wrapped.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence

from coati_compat.legacy.callbacks import MakerCallback, TrainerCallback

MOMENTS = {"on_fit_start": "on_run_start", "on_loop_start": "on_run_start", "on_batch_end": "on_round_end",
           "on_update_end": "on_round_end", "on_fit_end": "on_run_end", "on_loop_end": "on_run_end"}
NO_MOMENT = ("on_episode_start", "on_episode_end", "on_epoch_start", "on_epoch_end", "on_batch_start",
             "on_update_start", "on_make_experience_start", "on_make_experience_end", "on_send_start", "on_send_end")
RECORD_ONLY = ("step", "time")  # keys of the engine's record that no legacy metrics dict had


def _overridden(callback: Any, name: str) -> bool:
    """True when ``callback`` defines ``name`` itself (not the legacy base class's no-op)."""
    method = getattr(type(callback), name, None)
    if method is None:
        return False
    for base in (TrainerCallback, MakerCallback):
        if isinstance(callback, base):
            return method is not getattr(base, name, None)
    return True


class LegacyHook:
    """Wraps a legacy ``TrainerCallback`` or ``MakerCallback`` (or any object with their methods) as a hook.

    metrics: legacy metric name -> key of the engine's round record (``{"pg_loss": "loss"}``): the dict
      ``on_batch_end`` gets; None passes the record without ``step`` and ``time``.
    A maker callback's ``on_batch_end()`` takes no arguments and has no moment: it is not called.
    """

    def __init__(self, callback: Any, metrics: Optional[Mapping[str, str]] = None):
        self.callback = callback
        self.metrics = dict(metrics) if metrics is not None else None
        self.maker = isinstance(callback, MakerCallback)
        missing = [name for name in NO_MOMENT if _overridden(callback, name)]
        if self.maker and _overridden(callback, "on_batch_end"):
            missing.append("on_batch_end")
        if missing:
            warnings.warn(f"{type(callback).__name__} overrides {', '.join(missing)}, which the engine has no moment "
                          f"for: they are never called. The closest hook is on_round_end (after each round, with "
                          f"its metrics); see migration_guide/custom_code.md", stacklevel=2)

    def _legacy(self, name: str, *args: Any) -> None:
        if _overridden(self.callback, name):
            getattr(self.callback, name)(*args)

    def legacy_metrics(self, record: Mapping[str, Any]) -> Dict[str, Any]:
        """The ``metrics`` dict a legacy ``on_batch_end`` gets for this round record."""
        if self.metrics is None:
            return {k: v for k, v in record.items() if k not in RECORD_ONLY}
        missing = sorted(v for v in self.metrics.values() if v not in record)
        if missing:
            raise KeyError(f"LegacyHook(metrics=...) names {missing}, which the round's record does not hold; it "
                           f"holds {sorted(record)}")
        return {legacy: record[key] for legacy, key in self.metrics.items()}

    def on_run_start(self, config: Any) -> None:
        self._legacy("on_fit_start")
        self._legacy("on_loop_start")

    def on_round_end(self, step: int, record: Mapping[str, Any]) -> None:
        if not self.maker:
            self._legacy("on_batch_end", self.legacy_metrics(record), None)
        self._legacy("on_update_end")

    def on_run_end(self, result: Any) -> None:
        self._legacy("on_fit_end")
        self._legacy("on_loop_end")


def legacy_hooks(callbacks: Sequence[Any], metrics: Optional[Mapping[str, str]] = None) -> List[LegacyHook]:
    """`LegacyHook` for each legacy callback, for ``launch_distributed(callbacks=...)``."""
    return [LegacyHook(cb, metrics) for cb in callbacks]
