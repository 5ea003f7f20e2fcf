"""The predicates every config section checks its values with, written once, and `Check`, the one shape of "a
check and what it expects" the sections' key tables are written in."""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple


def is_int(v: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A finite int or float that is not a bool (infinity and NaN are refused everywhere)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_flag(v: Any) -> bool:
    """True or False (not 0/1)."""
    return isinstance(v, bool)


def is_positive_int(v: Any) -> bool:
    return is_int(v) and v > 0


def is_positive(v: Any) -> bool:
    return is_number(v) and v > 0


def is_non_negative(v: Any) -> bool:
    return is_number(v) and v >= 0


def is_pair(v: Any) -> bool:
    """None or [low, high], two numbers with low < high."""
    return v is None or (isinstance(v, (list, tuple)) and len(v) == 2 and all(map(is_number, v)) and v[0] < v[1])


def is_format_tags(v: Any) -> bool:
    """None or ColossalChat's ``response_format_tags``: name -> {"text": str, "num_occur": int >= 0}."""
    return v is None or (isinstance(v, dict) and bool(v) and all(
        isinstance(k, str) and isinstance(t, dict) and set(t) == {"text", "num_occur"} and isinstance(t["text"], str)
        and t["text"] != "" and isinstance(t["num_occur"], int) and not isinstance(t["num_occur"], bool)
        and t["num_occur"] >= 0 for k, t in v.items()))


def is_http_url(v: Any) -> bool:
    """None or an http(s) URL."""
    return v is None or (isinstance(v, str) and v.startswith(("http://", "https://")))


def is_registered(kind: str) -> Callable[[Any], bool]:
    """A check: the name of a function registered as ``kind`` (`coati_relay.algorithms.register`), any case."""
    def ok(v: Any) -> bool:
        from coati_relay import algorithms

        return isinstance(v, str) and v.lower() in algorithms.names(kind)
    return ok


def registered_names(kind: str) -> Callable[[Any], str]:
    """What `is_registered` expects, for the error message of ``value``, with the closest registered name."""
    def expect(value: Any) -> str:
        from coati_relay import algorithms
        from coati_relay.config.keys import closest

        hint = closest(str(value).lower(), algorithms.names(kind))
        return (f"the name of a registered {kind} function, one of {algorithms.names(kind)} (add your own with "
                f"@register({kind!r}, 'name') where the driver imports it, or give an import path "
                f"'module:function'){hint}")
    return expect


LR_SCHEDULERS = (None, "constant", "cosine", "colossalchat")  # grpo_config['lr_scheduler']; None: constant


class Check(NamedTuple):
    """One key of a section's table. ok: True for a valid value; expect: what is valid, for the error message (or a
    function of the value that says it); default: the value when the key is absent (a value, or a function of the
    values of the keys before it in the table), in sections that fill defaults. A schema field carries its check
    beside its meaning (`coati_relay.config.meaning.meaning`'s ``check``)."""

    ok: Callable[[Any], bool]
    expect: Any
    default: Any = None
