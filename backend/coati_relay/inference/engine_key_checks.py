"""Checks of engine keyword values that more than one inference backend's key table uses (`BackendSpec.engine_keys`):
a dtype given by name or as a torch dtype, a device."""
from __future__ import annotations

from typing import Any, Callable

DTYPE_NAMES = ("float32", "float16", "bfloat16")


def is_device(v: Any) -> bool:
    """``v`` names a CPU or CUDA torch device (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``)."""
    import torch

    try:
        return isinstance(v, (str, torch.device)) and torch.device(v).type in ("cpu", "cuda")
    except RuntimeError:
        return False


def dtype_check(allowed: tuple) -> Callable[[Any], bool]:
    """A check passing the names in ``allowed`` and the torch dtypes of `DTYPE_NAMES`."""
    def ok(v: Any) -> bool:
        import torch

        return v in allowed or v in tuple(getattr(torch, n) for n in DTYPE_NAMES)

    return ok
