"""CUDA calls of legacy model and data functions, redirected to the CPU inside the shim actors of a host without CUDA.

Legacy scripts end their model factories in ``.half().cuda()`` and their data functions in ``.cuda()`` or
``torch.randint(..., device=torch.cuda.current_device())``; those functions run inside the trainer and maker
actors. On a host without CUDA, `install` (called by the shim actors only, never in the driver) makes these calls
keep tensors and modules on the CPU, and warns once per process:

- ``Tensor.cuda()`` and ``Module.cuda()`` return the object unchanged (it already lives on the CPU);
- ``torch.cuda.current_device()`` returns ``torch.device("cpu")``, so ``device=torch.cuda.current_device()`` and
  ``.to(torch.cuda.current_device())`` place on the CPU;
- ``torch.cuda.set_device(...)`` and ``torch.cuda.synchronize(...)`` do nothing.

``torch.cuda.is_available()`` stays False, so code that asks before it moves anything keeps working as written.
Dtypes are left alone (``.half()`` stays fp16: the CPU kernels of torch 2 support it).
"""
from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Optional

import torch

logger = logging.getLogger(__name__)

WARNING_TEXT = ("no CUDA device in this process: legacy .cuda(), torch.cuda.current_device() and "
                "torch.cuda.set_device() calls are redirected to the CPU inside this actor")

_lock = threading.Lock()
_installed = False
_warned = False


def _note(call: str) -> None:
    global _warned
    if _warned:
        return
    with _lock:
        if _warned:
            return
        _warned = True
    logger.warning("%s (first call: %s)", WARNING_TEXT, call)
    warnings.warn(WARNING_TEXT, UserWarning, stacklevel=3)


def _tensor_cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> torch.Tensor:
    _note("Tensor.cuda()")
    return self


def _module_cuda(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
    _note("Module.cuda()")
    return self


def _current_device() -> torch.device:
    _note("torch.cuda.current_device()")
    return torch.device("cpu")


def _set_device(device: Any) -> None:
    _note("torch.cuda.set_device()")


def _synchronize(device: Optional[Any] = None) -> None:
    return None


def is_installed() -> bool:
    return _installed


def install() -> bool:
    """Redirects the CUDA calls above to the CPU when this process has no CUDA; returns whether it did.

    Idempotent. Meant for the inside of a shim actor: the driver keeps the real ``torch.cuda``.
    """
    global _installed
    if torch.cuda.is_available():
        return False
    with _lock:
        if _installed:
            return True
        torch.Tensor.cuda = _tensor_cuda  # type: ignore[method-assign]
        torch.nn.Module.cuda = _module_cuda  # type: ignore[method-assign]
        # transformers overrides Module.cuda with a version that calls Tensor.cuda: covered by the first patch.
        torch.cuda.current_device = _current_device  # type: ignore[assignment]
        torch.cuda.set_device = _set_device  # type: ignore[assignment]
        torch.cuda.synchronize = _synchronize  # type: ignore[assignment]
        _installed = True
    logger.info("CUDA calls redirected to the CPU in this process")
    return True


def compute_device() -> torch.device:
    """Where the legacy code put tensors for compute: the current CUDA device, or the CPU without CUDA."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
