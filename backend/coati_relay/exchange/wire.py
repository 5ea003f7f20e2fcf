"""Tensors as numpy arrays, the form in which they cross processes.

torch pickles a tensor through a legacy `torch.save` / `torch.load` of its storage that defines a new class on each
call, on both sides: cyclic garbage that only a full collection of Python's collector frees (about 6 classes a round
in each of the producer and the consumer of the toy soak, `benchmarks/memory_soak.py`), and slower than a
buffer copy. A numpy array pickles as a plain buffer, and Ray stores it out of band without pickling. bfloat16, which
numpy lacks, travels as int16 bits.
"""
from __future__ import annotations

import warnings
from dataclasses import fields
from typing import Any, Dict, NamedTuple

import numpy as np
import torch


class Wire(NamedTuple):
    """A tensor on the wire."""

    dtype: str  # its dtype's name (`dtype_name`)
    array: np.ndarray


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a dtype on the wire: "float32", "bfloat16", ..."""
    return str(dtype).replace("torch.", "")


def to_wire(t: torch.Tensor) -> Wire:
    """``t`` as (dtype name, numpy array): a view of a CPU tensor, a copy on the host of one on a device."""
    t = t.detach().cpu()
    return Wire(dtype_name(t.dtype), (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy())


def from_wire(wire: Wire, copy_read_only: bool = True) -> torch.Tensor:
    """The CPU tensor of `to_wire`'s form. An array read back from Ray's object store is read-only: it is copied
    (``copy_read_only``), or wrapped as it is for a caller that only reads it."""
    name, array = wire
    if copy_read_only and not array.flags.writeable:
        array = array.copy()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        t = torch.from_numpy(array)
    return t.view(torch.bfloat16) if name == "bfloat16" else t


def wired_fields(obj: Any) -> Dict[str, Any]:
    """A dataclass's fields by name, each tensor in `to_wire`'s form: the state its ``__reduce__`` pickles."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    return {k: to_wire(v) if isinstance(v, torch.Tensor) else v for k, v in values.items()}


def unwired(state: Dict[str, Any]) -> Dict[str, Any]:
    """`wired_fields`'s state with its tensors back (on the CPU): the keywords that rebuild the dataclass."""
    return {k: from_wire(v) if isinstance(v, Wire) else v for k, v in state.items()}
