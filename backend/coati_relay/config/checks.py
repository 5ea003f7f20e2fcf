"""The predicates every config section checks its values with, written once. Each takes a value and says whether
it is valid; the sections pair them with what they expect in their error messages."""
from __future__ import annotations

import math
from typing import Any


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
