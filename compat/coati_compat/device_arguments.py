"""CUDA device arguments on the CPU, for CPU mode (`coati_compat.cpu_mode`) on a host without CUDA.

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
CPU mode runs them in every thread that runs user code (`coati_compat.thread_hooks`). With the mode on, every torch
call of the thread (an ``a + b`` too) goes through one Python call: about 1 us more per call
(``benchmarks/test_cpu_mode_overhead.py``).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
# Where the functions that take a device positionally have it: Tensor.to(device, ...) and the parser of Module.to's
# arguments (torch 2.13's factories take the device only as a keyword).
_DEVICE_POSITION = {torch.Tensor.to: 1, torch._C._nn._parse_to: 0}

_local = threading.local()
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
