"""The ``callbacks`` keyword, checked in the driver before any actor starts: objects with the hook methods of
`coati_relay.callbacks.HOOKS`, a misspelt hook named with the closest one."""
from __future__ import annotations

from typing import Any, List, Sequence

from coati_relay.callbacks import HOOKS, STOPPING_HOOKS
from coati_relay.config.keys import closest


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
