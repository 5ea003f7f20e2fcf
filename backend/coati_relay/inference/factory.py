"""Builds an `InferenceBackend` by name, through its registered `BackendSpec` (`coati_relay.inference.registry`)."""
from __future__ import annotations

import importlib.util
from typing import Dict, Optional

import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.base import InferenceBackend
from coati_relay.inference.registry import backend_names, backend_spec


def build_inference_backend(name: str, model_path: str, sampling: SamplingConfig, **kwargs) -> InferenceBackend:
    """The backend registered as ``name`` (``"vllm"``: `VLLMBackend`, ``"transformers"``: `TransformersBackend`) with
    its own copy of ``model_path``; ``kwargs`` go to the constructor."""
    return backend_spec(name).build(model_path, sampling, **kwargs)


def build_backend_on_module(name: str, model: torch.nn.Module, sampling: SamplingConfig,
                            weights: Optional[Dict[str, torch.Tensor]] = None, **kwargs) -> InferenceBackend:
    """A backend generating from ``model``, a causal LM held in this process: ``"transformers"`` with the module
    itself (`TransformersBackend.around`: no copy, weights read in place), ``"vllm"`` an engine started from its
    ``weights`` (HF name -> tensor; default: its `module_weights`, LoRA layers folded) by `VLLMBackend.from_module`.
    ``kwargs``: ``eos_token_ids``, ``pad_token_id``, ``seed``, and for vLLM the engine's own."""
    return backend_spec(name).build_on_module(model, None, sampling, weights, **kwargs)


def resolve_backend_name(name: str, architecture: str) -> str:
    """``"auto"``: ``"vllm"`` where the installed vLLM runs ``architecture`` (a transformers class name such as
    ``"Qwen2ForCausalLM"``), else ``"transformers"``; ``"vllm"`` only where it runs it; any other registered name as
    is."""
    if name not in ("auto", *backend_names()):
        raise ValueError(f"inference backend must be 'auto' or one of {list(backend_names())}, got {name!r}")
    runs = name in ("auto", "vllm") and importlib.util.find_spec("vllm") is not None and _vllm_runs(architecture)
    if name == "vllm" and not runs:
        raise ValueError(f"inference backend 'vllm': the installed vLLM cannot run {architecture} (or is missing); "
                         "use 'transformers' or 'auto'")
    return ("vllm" if runs else "transformers") if name == "auto" else name


def _vllm_runs(architecture: str) -> bool:
    from vllm import ModelRegistry

    return architecture in ModelRegistry.get_supported_archs()
