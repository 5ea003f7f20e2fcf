"""Where a warning about the user's configuration points: the user's own call, not a line of this package.

`warn_at_user` issues a warning attributed to the first frame outside coati-relay (``coati_relay`` and the compat
layer ``coati_compat``): the user's ``launch_distributed(...)`` line, or the legacy script's line that built the
role. Under ``coati-relay run CONFIG.yaml`` (`config_file`) it is attributed to the YAML file instead.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import warnings
from typing import Iterator, Optional, Type

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # coati_relay/
_COMPAT = "coati_compat"
_CONFIG_FILE: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("coati_relay_config_file", default=None)


def _ours(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE) or f"{os.sep}{_COMPAT}{os.sep}" in path


@contextlib.contextmanager
def config_file(path: str) -> Iterator[None]:
    """While entered, `warn_at_user` attributes its warnings to ``path`` (the YAML file ``coati-relay run`` read)."""
    token = _CONFIG_FILE.set(str(path))
    try:
        yield
    finally:
        _CONFIG_FILE.reset(token)


def warn_at_user(message: str, category: Type[Warning]) -> None:
    """``warnings.warn(message, category)`` at the user's frame (or the config file, see `config_file`)."""
    path = _CONFIG_FILE.get()
    if path is not None:
        warnings.warn_explicit(message, category, path, 1, module="coati_relay.config")
        return
    frame, level = sys._getframe(1), 2  # stacklevel 2: the frame that called warn_at_user
    while frame is not None and _ours(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
