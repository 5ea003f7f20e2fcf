"""Tensors as numpy arrays, the form in which they cross processes.

torch pickles a tensor through a legacy `torch.save` / `torch.load` of its storage that defines a new class on each
call, on both sides: cyclic garbage that only a full collection of Python's collector frees (about 6 classes a round
in each of the producer and the consumer of the toy soak, `coati_relay.observe.memory_soak`), and slower than a
buffer copy. A numpy array pickles as a plain buffer, and Ray stores it out of band without pickling. bfloat16, which
numpy lacks, travels as int16 bits.
"""
from __future__ import annotations

import warnings
from typing import Tuple

import numpy as np
import torch

Wire = Tuple[str, np.ndarray]  # (dtype name, array)


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a dtype on the wire: "float32", "bfloat16", ..."""
    return str(dtype).replace("torch.", "")


def to_wire(t: torch.Tensor) -> Wire:
    """``t`` as (dtype name, numpy array): a view of a CPU tensor, a copy on the host of one on a device."""
    t = t.detach().cpu()
    return dtype_name(t.dtype), (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


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
