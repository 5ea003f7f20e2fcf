"""CUDA calls of legacy model and data functions, redirected to the CPU inside the shim actors of a host without CUDA.

Legacy scripts end their model factories in ``.half().cuda()`` and their data functions in ``.cuda()`` or
``torch.randint(..., device=torch.cuda.current_device())``; those functions run inside the trainer and maker
actors. On a host without CUDA, `install` (called by the shim actors, never in the driver; in CPU mode by every
process, `coati_compat.cpu_mode`, which also places CUDA device arguments such as ``device="cuda"`` on the CPU with
`coati_compat.device_arguments`) makes these calls keep tensors and modules on the CPU, and warns once per process:

- ``Tensor.cuda()`` and ``Module.cuda()`` return the object unchanged (it already lives on the CPU);
- ``torch.cuda.current_device()`` returns ``torch.device("cpu")``, so ``device=torch.cuda.current_device()`` and
  ``.to(torch.cuda.current_device())`` place on the CPU;
- ``torch.cuda.set_device(...)`` and ``torch.cuda.synchronize(...)`` do nothing.

``torch.cuda.is_available()`` stays False, so code that asks before it moves anything keeps working as written.

``Module.half()`` and ``Module.bfloat16()`` keep fp32 there too: on the CPU, fp16 forward+backward of a 2-layer toy
model took 11x, of a 22M-parameter model 26x the fp32 time, and fp32 weights train with the numbers the GPU runs got
from their fp32 master weights. ``COATI_RELAY_KEEP_HALF_ON_CPU=1`` keeps the low precision (the strategies then step
fp32 master copies, `coati_relay.training.master_weights`). Tensors' ``.half()`` is left alone.
"""
from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Any, Optional

import torch

from coati_relay.parts import accelerator_device

logger = logging.getLogger(__name__)

WARNING_TEXT = ("no CUDA device in this process: legacy .cuda(), torch.cuda.current_device() and "
                "torch.cuda.set_device() calls are redirected to the CPU inside this actor")
KEEP_HALF_ENV = "COATI_RELAY_KEEP_HALF_ON_CPU"
HALF_WARNING_TEXT = (f"no CUDA device in this process: Module.half() and Module.bfloat16() keep fp32 inside this actor "
                     f"(CPU fp16 kernels are an order of magnitude slower); set {KEEP_HALF_ENV}=1 to keep fp16")

_lock = threading.Lock()
_installed = False
_warned: set = set()


def _note(call: str, text: str = WARNING_TEXT) -> None:
    if text in _warned:
        return
    with _lock:
        if text in _warned:
            return
        _warned.add(text)
    logger.warning("%s (first call: %s)", text, call)
    warnings.warn(text, UserWarning, stacklevel=3)


def _tensor_cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> torch.Tensor:
    _note("Tensor.cuda()")
    return self


def _module_cuda(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
    _note("Module.cuda()")
    return self


def _module_keep_fp32(self: torch.nn.Module) -> torch.nn.Module:
    _note("Module.half()", HALF_WARNING_TEXT)
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
        if os.environ.get(KEEP_HALF_ENV, "") not in ("1", "true", "yes"):
            torch.nn.Module.half = _module_keep_fp32  # type: ignore[method-assign]
            torch.nn.Module.bfloat16 = _module_keep_fp32  # type: ignore[method-assign]
        _installed = True
    logger.info("CUDA calls redirected to the CPU in this process")
    return True


compute_device = accelerator_device  # where the legacy code put tensors for compute: the engine's rule
