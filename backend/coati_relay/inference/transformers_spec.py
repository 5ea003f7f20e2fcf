"""The ``"transformers"`` inference backend's `BackendSpec`: `TransformersBackend`, on a checkpoint or around the
training module itself."""
from __future__ import annotations

from functools import partial
from typing import Any, Dict, List, Optional

import torch

from coati_relay.config.checks import Check, is_flag
from coati_relay.inference.engine_key_checks import DTYPE_NAMES, dtype_check, is_device
from coati_relay.inference.generate_keys import classify
from coati_relay.inference.registry import BackendSpec, register_backend

# What `TransformersBackend` takes besides what the producer sets, each with its check.
TRANSFORMERS_KEYS: Dict[str, Check] = {
    "dtype": Check(dtype_check(DTYPE_NAMES), f"one of {list(DTYPE_NAMES)} or a torch dtype"),
    "device": Check(is_device, "'cpu', 'cuda' or 'cuda:N' (default: the producer's GPU where it has one)"),
    "attn_implementation": Check(lambda v: isinstance(v, str), "a str such as 'sdpa', 'eager' or "
                                                               "'flash_attention_2'"),
    "fused_decode": Check(is_flag, "True or False (default True): decode Llama, Qwen2 and Mistral models through "
                                   "the fused one-token step (one matmul for q, k, v and one for gate and up); "
                                   "other models always use their own forward"),
    "compiled_decode": Check(is_flag, "True or False (default False): decode through one torch.compile'd step "
                                      "per shape bucket over a static cache; pays only where the run's steps "
                                      "repay its compilation (benchmarks/README.md)"),
}


def _build(model_path: str, sampling, **kwargs):
    from coati_relay.inference.transformers_backend import TransformersBackend

    return TransformersBackend(model_path, sampling, **kwargs)


def _around(model: torch.nn.Module, model_path: Optional[str], sampling, weights=None, **kwargs):
    """`TransformersBackend.around`: reads ``model``'s weights in place, so ``weights`` is not needed."""
    from coati_relay.inference.transformers_backend import TransformersBackend

    return TransformersBackend.around(model, model_path, sampling, **kwargs)


def _flash_attention_2(errors: List[str], imc: Dict[str, Any], differences: Optional[List[str]], cuda: bool) -> None:
    """ColossalChat's ``use_flash_attention_2`` becomes ``attn_implementation="flash_attention_2"`` where CUDA and
    flash-attn are present; elsewhere the default attention runs and ``differences`` says so."""
    if "use_flash_attention_2" not in imc:
        return
    from coati_relay.cluster.devices import flash_attention_available

    flash = imc.pop("use_flash_attention_2")
    if not isinstance(flash, bool):
        errors.append(f"inference_model_config['use_flash_attention_2'] must be True or False, got {flash!r}")
    elif flash and "attn_implementation" not in imc:
        if flash_attention_available(cuda):
            imc["attn_implementation"] = "flash_attention_2"
        elif differences is not None:
            differences.append("inference_model_config['use_flash_attention_2']=True: flash attention 2 needs "
                               "CUDA and the flash-attn package, which this host lacks; producers generate with "
                               "the model's default attention instead")


SPEC = register_backend(BackendSpec(
    name="transformers", build=_build, build_on_module=_around, engine_keys=TRANSFORMERS_KEYS,
    generate_key=partial(classify, "transformers"), stop_key="stop_strings",
    engine_dtype=partial(getattr, torch), adapt_keys=_flash_attention_2, generates_in_place=True,
    in_place_keys=("fused_decode", "compiled_decode")))
