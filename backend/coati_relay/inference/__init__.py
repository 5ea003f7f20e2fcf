"""Inference backends: turn prompt token ids into `Rollout`s, and load new weights between generations."""
from coati_relay.inference.base import InferenceBackend, SamplingConfig
from coati_relay.inference.factory import BACKEND_NAMES, build_inference_backend
from coati_relay.inference.transformers_backend import TransformersBackend
from coati_relay.inference.vllm_backend import VLLMBackend

__all__ = ["InferenceBackend", "SamplingConfig", "TransformersBackend", "VLLMBackend", "build_inference_backend",
           "BACKEND_NAMES"]
