"""``COATI_RELAY_LEGACY_NAMES``: which legacy meaning this process asks for.

- unset, empty or ``0``: the default. Beside ColossalChat's ``coati``, a name both define keeps ColossalChat's
  meaning; legacy calls follow the reference release (ColossalAI ``b5f056636``) wherever the two legacy releases'
  call forms cannot be told apart from the arguments.
- ``1`` / ``true`` / ``yes``: the legacy names replace ColossalChat's (see ``coati_compat.imports.finder``).
- ``final`` / ``be400a093``: as ``1``, and the ambiguous call forms take the final release's (ColossalAI
  ``be400a093``) meaning instead, e.g. the critic's value at the last non-pad token. Each such case is a row of
  ``migration_guide/deviations.md``.

Torch-free and read at every call, so a test (or a script) can switch it with the environment.
"""
from __future__ import annotations

import os

LEGACY_NAMES_ENV = "COATI_RELAY_LEGACY_NAMES"

LEGACY_VALUES = ("1", "true", "yes")
FINAL_VALUES = ("final", "be400a093")
OFF_VALUES = ("", "0", "false", "no")


def _value() -> str:
    value = os.environ.get(LEGACY_NAMES_ENV, "").strip().lower()
    if value not in LEGACY_VALUES + FINAL_VALUES + OFF_VALUES:
        raise ValueError(f"{LEGACY_NAMES_ENV}={value!r} is not understood; use 1 (legacy names), final (legacy names "
                         "with the final release's meaning where the call forms are ambiguous) or leave it unset")
    return value


def legacy_names() -> bool:
    """True when the legacy names should replace ColossalChat's in this process."""
    return _value() in LEGACY_VALUES + FINAL_VALUES


def final_release() -> bool:
    """True when ambiguous legacy call forms should take the final release's (``be400a093``) meaning."""
    return _value() in FINAL_VALUES
