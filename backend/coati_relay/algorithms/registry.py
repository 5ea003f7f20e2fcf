"""Name registry for the algorithm functions: advantage estimators, policy and value losses, KL estimators.

Engine, legacy shims and the reference look functions up by name, so each formula exists exactly once.
"""
from __future__ import annotations

from typing import Callable, Dict, List, TypeVar

KINDS = ("advantage", "policy_loss", "value_loss", "kl")

_REGISTRY: Dict[str, Dict[str, Callable]] = {kind: {} for kind in KINDS}

F = TypeVar("F", bound=Callable)


def _table(kind: str) -> Dict[str, Callable]:
    if kind not in _REGISTRY:
        raise ValueError(f"unknown algorithm kind {kind!r}; use one of {list(KINDS)}")
    return _REGISTRY[kind]


def register(kind: str, name: str) -> Callable[[F], F]:
    """Decorator: registers ``fn`` under ``(kind, name)``. Names are case-insensitive; a taken name raises."""
    table = _table(kind)
    key = name.lower()

    def deco(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"register({kind!r}, {name!r}) needs a callable, got {type(fn).__name__}")
        if key in table and table[key] is not fn:
            raise ValueError(f"{kind} {name!r} is already registered ({table[key].__qualname__}); pick another name")
        table[key] = fn
        return fn

    return deco


def get(kind: str, name: str) -> Callable:
    """The function registered under ``(kind, name)``; an unknown name raises ValueError listing the known ones."""
    table = _table(kind)
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a str, got {type(name).__name__}")
    try:
        return table[name.lower()]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; registered: {sorted(table)}") from None


def names(kind: str) -> List[str]:
    """Sorted names registered under ``kind``."""
    return sorted(_table(kind))
