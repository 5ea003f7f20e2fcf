"""Inference backends: turn prompt token ids into `Rollout`s, and load new weights between generations."""
from coati_relay.inference.base import InferenceBackend
from coati_relay.inference.factory import (
    BACKEND_NAMES,
    build_backend_on_module,
    build_inference_backend,
    resolve_backend_name,
)
from coati_relay.inference.transformers_backend import TransformersBackend
from coati_relay.inference.vllm_backend import VLLMBackend

__all__ = ["InferenceBackend", "TransformersBackend", "VLLMBackend", "build_inference_backend",
           "build_backend_on_module", "resolve_backend_name", "BACKEND_NAMES"]
