"""`trim_heap`: hand the C heap's free memory back to the operating system (glibc's ``malloc_trim``)."""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Optional

log = logging.getLogger(__name__)
_LIBC: Optional[ctypes.CDLL] = None


def trim_heap() -> bool:
    """``malloc_trim(0)``: returns the free pages of every malloc arena to the OS, so that memory a round freed stops
    counting in the process's RSS. False where the C library has no ``malloc_trim`` (not glibc)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True
