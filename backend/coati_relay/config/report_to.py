"""The ``report_to`` keyword, checked in the driver before any actor starts: the experiment trackers besides
metrics.jsonl (`coati_relay.observe.trackers` starts them)."""
from __future__ import annotations

from typing import Any, Tuple

TRACKERS = ("tensorboard", "wandb")
REPORT_TO_CHOICES = TRACKERS + ("none",)


def check_report_to(value: Any) -> Tuple[str, ...]:
    """``report_to`` as a tuple of tracker names: None, ``"none"`` or ``[]`` give ``()`` (metrics.jsonl only); a
    name or a list of names from `REPORT_TO_CHOICES`. Raises ValueError naming the allowed values."""
    allowed = f"allowed: a list of {list(REPORT_TO_CHOICES)} (e.g. report_to=['tensorboard', 'wandb']), or None"
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"report_to must be a tracker name or a list of them, got {value!r}; {allowed}")
    unknown = [n for n in names if n not in REPORT_TO_CHOICES]
    if unknown:
        raise ValueError(f"report_to has unknown tracker(s) {unknown}; {allowed}")
    if "none" in names and len(set(names)) > 1:
        raise ValueError(f"report_to={list(names)} asks for 'none' and a tracker; give 'none' alone (metrics.jsonl "
                         f"only) or the trackers alone")
    return tuple(dict.fromkeys(n for n in names if n != "none"))
