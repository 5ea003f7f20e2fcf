"""The device rule of a run: every model has one device, and tensors reach a model only through `to_device`.

- Policy, reference model and critic (consumer): the training device, CUDA (the process's current device) where the
  host has CUDA, since every Booster plugin then trains there; else the CPU. `TrainingBackend.device` is it.
- Producer: its inference engine's device (vLLM on a CUDA host runs on CUDA; `TransformersBackend` takes ``device``
  from ``inference_model_config``, default the accelerator). A reward model sits on the producer's device.

A tensor goes to a model's device once, where it enters the role (the consumer's batch, the reward model's
inputs), with `to_device`; results leave with `to_host`.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union, overload

import torch

DeviceLike = Union[str, torch.device]


def accelerator_device() -> torch.device:
    """``cuda:<current device>`` where CUDA is available, else ``cpu``."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def resolve_device(requested: Optional[DeviceLike] = None) -> torch.device:
    """The device a model goes to: ``requested`` when given (checked), else `accelerator_device()`.

    A CUDA device on a host without CUDA is an error, never a silent move to the CPU.
    """
    if requested is None:
        return accelerator_device()
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {requested!r} is not a torch device: use 'cpu', 'cuda' or 'cuda:N'") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {requested!r} asks for CUDA, which this host does not have; use 'cpu' or "
                             "leave the device unset (the accelerator where there is one, else the CPU)")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= torch.cuda.device_count():
            raise ValueError(f"device {requested!r}: this host has {torch.cuda.device_count()} CUDA device(s)")
    return device


@overload
def to_device(device: DeviceLike, tensor: torch.Tensor) -> torch.Tensor: ...


@overload
def to_device(device: DeviceLike, tensor: Optional[torch.Tensor], *more: Optional[torch.Tensor]) -> Tuple: ...


def to_device(device: DeviceLike, tensor: Optional[torch.Tensor], *more: Optional[torch.Tensor]):
    """Each tensor moved to ``device`` (None passes through): one tensor for one argument, else a tuple.

    The one way a tensor reaches a model: where inputs and weights share a device the move is free; from the host
    to CUDA it goes through pinned memory, without blocking.
    """
    target = torch.device(device)
    moved = tuple(None if t is None else _move(t, target) for t in (tensor, *more))
    return moved[0] if not more else moved


def _move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host to CUDA through pinned memory without blocking the host (the copy is queued on the current stream,
    before any kernel that reads it); other moves as ``Tensor.to``."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A result moved back to the CPU (the device of rollouts, rewards and everything sent between roles)."""
    return tensor.to("cpu")


def flash_attention_available(cuda: bool) -> bool:
    """Whether ``attn_implementation="flash_attention_2"`` can run: CUDA and the flash-attn package."""
    import importlib.util

    return cuda and importlib.util.find_spec("flash_attn") is not None
