"""Inference backends: turn prompt token ids into `Rollout`s, and load new weights between generations. Each registers
a `BackendSpec` (`coati_relay.inference.registry`), looked up by name with `backend_spec`."""
from coati_relay.inference import vllm_spec, transformers_spec  # noqa: F401, I001  (they register in this order)
from coati_relay.inference.base import InferenceBackend
from coati_relay.inference.factory import build_backend_on_module, build_inference_backend, resolve_backend_name
from coati_relay.inference.registry import BackendSpec, backend_names, backend_spec, register_backend
from coati_relay.inference.transformers_backend import TransformersBackend
from coati_relay.inference.vllm_backend import VLLMBackend

__all__ = ["InferenceBackend", "TransformersBackend", "VLLMBackend", "build_inference_backend",
           "build_backend_on_module", "resolve_backend_name", "BackendSpec", "backend_spec", "backend_names",
           "register_backend"]
