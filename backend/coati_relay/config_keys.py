"""Checks of the keys of a configuration section: a ColossalChat key without effect here warns once, an unknown key
is an error that names the closest valid one."""
from __future__ import annotations

import difflib
import logging
from typing import Any, Iterable, List, Mapping

log = logging.getLogger(__name__)

_WARNED: set = set()


def closest(name: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid name closest to ``name``, or an empty string."""
    match = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def warn_ignored(section: str, key: str, reason: str) -> None:
    """One warning per process for a ColossalChat key that has no effect here."""
    if (section, key) not in _WARNED:
        _WARNED.add((section, key))
        log.warning("%s[%r] is accepted for ColossalChat compatibility but has no effect here: %s", section, key,
                    reason)


def check_section_keys(errors: List[str], section: str, given: Mapping[str, Any], used: Iterable[str],
                       ignored: Mapping[str, str]) -> None:
    """``given``'s keys must be in ``used`` (read by the run) or ``ignored`` (key -> why it has no effect)."""
    valid = [*used, *ignored]
    for key in sorted(set(given) - set(valid)):
        errors.append(f"{section} has no key {key!r}{closest(key, valid)}; valid keys: {sorted(valid)}")
    for key in sorted(set(given) & set(ignored)):
        warn_ignored(section, key, ignored[key])
