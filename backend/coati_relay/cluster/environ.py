"""Putting ``os.environ`` back as a run found it: engines and Ray set variables in the driver's process (vLLM's
``LD_PRELOAD`` and ``LOCAL_RANK``, Ray's ``RAY_CLIENT_MODE``, ...) that processes started afterwards would inherit."""
from __future__ import annotations

import os
from typing import Mapping


def restore_environ(saved: Mapping[str, str]) -> None:
    """Removes the variables added since ``saved = dict(os.environ)`` was taken and resets the changed ones, key by
    key (never an empty environment in between, which threads still running would see)."""
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
