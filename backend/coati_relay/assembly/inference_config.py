"""``inference_model_config``: the keys each inference backend takes, checked in the driver before any actor starts.

``path`` (the checkpoint) is read by every backend. The other keys are keywords of the producers' engines, from the
allow-list of each backend's `BackendSpec` (`coati_relay.inference.registry`: ``engine_keys``, each with a check of its
value; vLLM's in `coati_relay.inference.vllm_spec`, transformers' in `coati_relay.inference.transformers_spec`).
Keys the engine sets itself, or cannot honour, are refused with what to do instead (`REFUSED_KEYS`, and the spec's
``refused_keys``); ``torch_dtype`` is read as ``dtype``. Any other key is an error naming the closest valid one.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from coati_relay.config.keys import closest

ALIASES = {"torch_dtype": "dtype"}  # ColossalChat's transformers producers pass torch_dtype

# Keys refused for every backend, with what to do instead.
REFUSED_KEYS = {
    "model": "the checkpoint is inference_model_config['path']",
    "tokenizer": "the tokenizer is tokenizer_config['path'] (default: the model's own)",
    "seed": "each producer's engine is seeded with launch_distributed(seed=...) plus its index; set seed there",
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
                          f"coati_relay/assembly/inference_config.py)")
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

