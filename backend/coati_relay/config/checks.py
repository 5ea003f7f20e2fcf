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


LR_SCHEDULERS = (None, "constant", "cosine", "colossalchat")  # grpo_config['lr_scheduler']; None: constant


class Check(NamedTuple):
    """One key of a section's table. ok: True for a valid value; expect: what is valid, for the error message (or a
    function of the value that says it); default: the value when the key is absent (a value, or a function of the
    values of the keys before it in the table), in sections that fill defaults. What a key means is said by its
    schema field."""

    ok: Callable[[Any], bool]
    expect: Any
    default: Any = None
