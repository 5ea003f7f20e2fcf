"""Legacy ``coati.quant``: importable, so that scripts that import it keep working.

``llama_load_quant`` (GPTQ checkpoints through a vendored GPTQ kernel) is not supported and raises, saying what to
use instead; ``low_resource_init`` skips the random initialisation of weights that are loaded afterwards.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from coati_compat.imports.deprecations import deprecated_api

_INIT_FUNCTIONS = ("kaiming_uniform_", "kaiming_normal_", "uniform_", "normal_", "xavier_uniform_",
                   "xavier_normal_", "trunc_normal_")


@deprecated_api("coati.quant.llama_load_quant")
def llama_load_quant(model: Any, checkpoint: str, wbits: int, groupsize: int) -> Any:
    """Not supported: raises NotImplementedError naming the alternatives."""
    raise NotImplementedError(
        f"coati.quant.llama_load_quant (GPTQ {wbits}-bit, group size {groupsize}, checkpoint {checkpoint!r}) is not "
        "supported by coati-relay. Load a GPTQ checkpoint with transformers instead "
        "(AutoModelForCausalLM.from_pretrained(path, quantization_config=GPTQConfig(...)), which needs CUDA and the "
        "optimum/gptqmodel packages), or drop --initial_model_quant_ckpt and use an unquantized initial model.")


@deprecated_api("coati.quant.low_resource_init")
@contextlib.contextmanager
def low_resource_init() -> Iterator[None]:
    """Inside the block, ``torch.nn.init`` initialisers do nothing (models built there keep uninitialised
    weights, to be overwritten by a checkpoint); they are restored on exit."""
    saved = {name: getattr(torch.nn.init, name) for name in _INIT_FUNCTIONS}

    def skip(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return tensor

    try:
        for name in _INIT_FUNCTIONS:
            setattr(torch.nn.init, name, skip)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)
