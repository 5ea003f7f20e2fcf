"""CUDA on the CPU, one place for both ways GPU-era code reaches it on a host without CUDA.

1. CUDA calls (`install`). Legacy scripts end their model factories in ``.half().cuda()`` and their data functions
in ``.cuda()`` or ``torch.randint(..., device=torch.cuda.current_device())``; those functions run inside the trainer
and maker actors. On a host without CUDA, `install` (called by the shim actors, never in the driver; in CPU mode by
every process, `coati_compat.cpu_mode.patches`) makes these calls keep tensors and modules on the CPU, and warns once
per process:

- ``Tensor.cuda()`` and ``Module.cuda()`` return the object unchanged (it already lives on the CPU);
- ``torch.cuda.current_device()`` returns ``torch.device("cpu")``, so ``device=torch.cuda.current_device()`` and
  ``.to(torch.cuda.current_device())`` place on the CPU;
- ``torch.cuda.set_device(...)`` and ``torch.cuda.synchronize(...)`` do nothing.

``torch.cuda.is_available()`` stays False, so code that asks before it moves anything keeps working as written.

``Module.half()`` and ``Module.bfloat16()`` keep fp32 there too: on the CPU, fp16 forward+backward of a 2-layer toy
model took 11x, of a 22M-parameter model 26x the fp32 time, and fp32 weights train with the numbers the GPU runs got
from their fp32 master weights. ``COATI_RELAY_KEEP_HALF_ON_CPU=1`` keeps the low precision (the strategies then step
fp32 master copies, `coati_relay.training.master_weights`). Tensors' ``.half()`` is left alone.

2. CUDA device arguments (`CudaToCpu`, CPU mode only).
GPU-era code passes CUDA devices as arguments: ``torch.randint(..., device="cuda")``, ``torch.tensor(..., device=0)``,
``torch.empty_like(t, device="cuda:1")``, ``t.to(torch.device("cuda", rank))``, ``t.to(device="cuda", dtype=...)``,
``model.to("cuda")``. Without CUDA each fails ("Torch not compiled with CUDA enabled"). `CudaToCpu` is one
``torch.overrides.TorchFunctionMode`` that sees every torch function call of its thread and, before the call:

- replaces a ``device=`` keyword that names a CUDA device by ``torch.device("cpu")`` (every factory and
  ``*_like``/``new_*`` function, ``Tensor.to``; torch 2.13's factories take the device only as a keyword);
- replaces the positional device of ``Tensor.to(device, ...)`` the same way, and that of
  ``torch._C._nn._parse_to``, with which ``Module.to`` parses its arguments before it moves each tensor with
  ``Tensor.to(device, ...)``; so ``Module.to`` is covered too.

A CUDA device is a string ``"cuda"``/``"cuda:N"``, a ``torch.device`` of type ``cuda`` (``torch.device("cuda", N)``
stays constructible without CUDA) or an int ordinal ``N >= 0`` (what ``device=0`` means: the current accelerator).
Other devices (``"cpu"``, ``"meta"``, the CPU device ``torch.cuda.current_device()`` returns in CPU mode) pass
unchanged. The mode is the bottom of its thread's mode stack, so a mode pushed later (``with torch.device("cuda"):``,
``torch.set_default_device("cuda")``) hands its CUDA device down to it.

A function mode lives on a thread-local stack: `activate` pushes it on the calling thread's, `deactivate` pops it;
CPU mode runs them in every thread that runs user code (`coati_compat.cpu_mode.thread_hooks`). With the mode on,
every torch call of the thread (an ``a + b`` too) goes through one Python call: about 1 us more per call
(``benchmarks/test_cpu_mode_overhead.py``).
"""
from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

logger = logging.getLogger(__name__)

_CPU = torch.device("cpu")  # where both redirects place what asked for CUDA

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
    return _CPU


def _set_device(device: Any) -> None:
    _note("torch.cuda.set_device()")


def _synchronize(device: Optional[Any] = None) -> None:
    return None



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


# -- CUDA device arguments (CPU mode) ------------------------------------------------------------------------------
# Where the functions that take a device positionally have it: Tensor.to(device, ...) and the parser of Module.to's
# arguments (torch 2.13's factories take the device only as a keyword).
_DEVICE_POSITION = {torch.Tensor.to: 1, torch._C._nn._parse_to: 0}

_local = threading.local()  # .active: the mode is on this thread's stack
_mode: Optional["CudaToCpu"] = None


def is_cuda_device(device: Any) -> bool:
    """Whether ``device`` (string, ``torch.device`` or int ordinal) names a CUDA device."""
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool) and device >= 0


class CudaToCpu(TorchFunctionMode):
    """The function mode that places CUDA device arguments on the CPU (module docstring). ``on_first`` is called
    once, with the call's name, at the first redirect."""

    def __init__(self, on_first: Callable[[str], None]) -> None:
        super().__init__()
        self._on_first: Optional[Callable[[str], None]] = on_first

    def __torch_function__(self, func: Any, types: Sequence[type], args: Sequence[Any] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        if kwargs:
            device = kwargs.get("device")
            if device is not None and is_cuda_device(device):
                kwargs = {**kwargs, "device": _CPU}
                self._noted(func)
        else:
            kwargs = {}
        at = _DEVICE_POSITION.get(func)
        if at is not None and len(args) > at and is_cuda_device(args[at]):
            args = (*args[:at], _CPU, *args[at + 1:])
            self._noted(func)
        return func(*args, **kwargs)

    def _noted(self, func: Any) -> None:
        on_first, self._on_first = self._on_first, None
        if on_first is not None:
            on_first(torch.overrides.resolve_name(func) or repr(func))


def configure(on_first: Callable[[str], None]) -> None:
    """Creates the process's mode (idempotent); ``on_first(call_name)`` runs at its first redirect."""
    global _mode
    if _mode is None:
        _mode = CudaToCpu(on_first)


def activate() -> Optional[Callable[[], None]]:
    """Pushes the process's mode on this thread's function-mode stack unless it is there; returns `deactivate` when
    it pushed, None otherwise (also before `configure`)."""
    if _mode is None or getattr(_local, "active", False):
        return None
    _mode.__enter__()
    _local.active = True
    return deactivate


def deactivate() -> None:
    """Pops the mode from this thread's stack, where `activate` pushed it."""
    if _mode is not None and getattr(_local, "active", False):
        _local.active = False
        _mode.__exit__(None, None, None)
