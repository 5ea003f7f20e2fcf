"""``generate_config``: how producers sample, checked key by key into a `SamplingConfig` (whose section and fields
say what each key means; `coati_relay.inference.generate_keys` says which backend knows which key).

``temperature`` and ``top_p`` are required because ColossalChat's ``launch_distributed`` reads both to name the run
(a KeyError there without them). A key given as None counts as not given because ColossalChat's transformers example
passes ``max_new_tokens=None``.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping

from coati_relay.config.checks import is_int, is_number
from coati_relay.config.keys import closest, warn_ignored
from coati_relay.config.meaning import default_of
from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.generate_keys import (
    ENGINE_KEYS,
    TRANSFORMERS_FORCED,
    TRANSFORMERS_NATIVE,
    VLLM_FORCED,
    VLLM_SAMPLING_KEYS,
    transformers_generate_keys,
)
from coati_relay.inference.registry import find_backend

GENERATE_KEYS = ENGINE_KEYS
REQUIRED_KEYS = ("temperature", "top_p")
DEFAULT_MAX_NEW_TOKENS = default_of(SamplingConfig, "max_new_tokens")  # where no key gives one

log = logging.getLogger(__name__)


def _max_new_tokens(errors: List[str], gen: Mapping[str, Any], grpo: Mapping[str, Any], prompt_tokens: int) -> int:
    """The response length: generate_config's max_new_tokens or max_tokens (vLLM's name), else transformers'
    max_length less the left-padded prompt's ``prompt_tokens``, else grpo_config's max_new_tokens."""
    given = {f"generate_config['{k}']": gen[k] for k in ("max_new_tokens", "max_tokens") if gen.get(k) is not None}
    total = gen.get("max_length")
    if not given and total is not None:
        if not is_int(total) or total <= prompt_tokens:
            errors.append(f"generate_config['max_length'] (transformers: prompt plus response tokens) must be an int "
                          f"> train_dataset_config['max_length'] = {prompt_tokens} (every prompt is left-padded to "
                          f"it), got {total!r}; or give max_new_tokens")
            return DEFAULT_MAX_NEW_TOKENS
        return total - prompt_tokens
    if not given and grpo.get("max_new_tokens") is not None:
        given["grpo_config['max_new_tokens']"] = grpo["max_new_tokens"]
    if len(set(map(repr, given.values()))) > 1:
        errors.append(f"{' and '.join(given)} disagree ({list(given.values())}); give one of them")
    for name, value in given.items():
        if not is_int(value) or value < 1:
            errors.append(f"{name} must be an int >= 1 (tokens per response), got {value!r}")
            return DEFAULT_MAX_NEW_TOKENS
    return next(iter(given.values()), DEFAULT_MAX_NEW_TOKENS)


def _check_keys(errors: List[str], gen: Mapping[str, Any], backend: str, required: bool) -> Dict[str, Any]:
    """Classifies every key for ``backend`` (its spec's ``generate_key``); returns the keys handed to the backend
    unchanged."""
    if required:
        missing = [k for k in REQUIRED_KEYS if gen.get(k) is None]
        if missing:
            errors.append(f"generate_config needs {' and '.join(map(repr, missing))}: ColossalChat's "
                          f"launch_distributed reads generate_config['temperature'] and ['top_p'] (a KeyError "
                          f"there without them); add e.g. 'temperature': 1.0, 'top_p': 1.0")
    spec = find_backend(backend)
    if spec is None:
        return {}
    passed: Dict[str, Any] = {}
    valid = [*ENGINE_KEYS, *TRANSFORMERS_NATIVE, *TRANSFORMERS_FORCED, *VLLM_SAMPLING_KEYS]
    for key in sorted(gen):
        kind, why = spec.generate_key(key)
        if kind == "error":
            hint = "" if key in VLLM_SAMPLING_KEYS or key in transformers_generate_keys() else closest(key, valid)
            errors.append(f"generate_config has key {key!r}{hint}: {why}")
        elif kind == "forced":
            warn_ignored("generate_config", key, {**TRANSFORMERS_FORCED, **VLLM_FORCED}[key])
        elif kind == "passed" and key != "stop" and gen[key] is not None:
            passed[key] = gen[key]
    return passed


def _strings(errors: List[str], gen: Mapping[str, Any], key: str) -> List[str]:
    value = gen.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
        errors.append(f"generate_config[{key!r}] must be a non-empty string or a list of them, got {value!r}")
        return []
    return list(value)


def build_sampling(errors: List[str], gen: Dict[str, Any], grpo: Mapping[str, Any], backend: str = "transformers",
                   core_algo: str = "GRPO", prompt_tokens: int = 512) -> SamplingConfig:
    """The checked `SamplingConfig` of ``generate_config`` for ``backend`` (the ``inference_backend``);
    ``prompt_tokens``: train_dataset_config's max_length (the left-padded prompt width, for transformers'
    max_length). Problems go to ``errors`` (defaults stand in)."""
    options = _check_keys(errors, gen, backend, required=core_algo != "PPO")
    max_new = _max_new_tokens(errors, gen, grpo, prompt_tokens)
    temperature = gen.get("temperature")
    if temperature is None:
        temperature = 1.0
    elif not is_number(temperature) or temperature <= 0:
        errors.append(f"generate_config['temperature'] must be a number > 0 (RL samples; 0 would be greedy), "
                      f"got {temperature!r}")
        temperature = 1.0
    top_p = gen.get("top_p")
    if top_p is None:
        top_p = 1.0
    elif not is_number(top_p) or not 0 < top_p <= 1:
        errors.append(f"generate_config['top_p'] must be a number in (0, 1] (1: off), got {top_p!r}")
        top_p = 1.0
    top_k = gen.get("top_k")
    if top_k is None:
        top_k = -1
    elif not is_int(top_k) or top_k < -1:
        errors.append(f"generate_config['top_k'] must be -1 or 0 (off: vLLM's and transformers' words for it) or an "
                      f"int >= 1, got {top_k!r}")
        top_k = -1
    elif top_k == 0:
        top_k = -1
    seed = gen.get("seed")
    if seed is not None and (not is_int(seed) or seed < 0):
        errors.append(f"generate_config['seed'] must be None or an int >= 0, got {seed!r}")
        seed = None
    elif seed is not None:
        log.warning("generate_config['seed']=%d: every generate call draws the same random numbers (vLLM's "
                    "per-request seed), so the samples of successive rounds are correlated and learning can stall "
                    "(the vs-TRL benchmark's reward stayed near 0.5 for 4-5 steps in 3 of 7 runs, in none of 6 "
                    "without it); for a reproducible run, drop it and set launch_distributed(seed=...)", seed)
    ignore_eos = gen.get("ignore_eos")
    if ignore_eos is not None and not isinstance(ignore_eos, bool):
        errors.append(f"generate_config['ignore_eos'] must be a bool, got {ignore_eos!r}")
    stop = gen.get("stop_token_ids")
    if stop is None:
        stop = []
    elif not isinstance(stop, (list, tuple)) or not all(is_int(t) and t >= 0 for t in stop):
        errors.append(f"generate_config['stop_token_ids'] must be a list of token ids (ints >= 0), got {stop!r}")
        stop = []
    do_sample = gen.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        errors.append(f"generate_config['do_sample'] must be a bool, got {do_sample!r}")
    beams = gen.get("num_beams")
    if beams is not None and beams != 1:
        errors.append(f"generate_config['num_beams'] must be 1 (rollouts are sampled, one beam), got {beams!r}")
    spec = find_backend(backend)
    stop_strings = _strings(errors, gen, "stop_strings" if spec is None else spec.stop_key)
    return SamplingConfig(max_new_tokens=max_new, temperature=float(temperature), top_k=top_k, top_p=float(top_p),
                          seed=seed, stop_token_ids=list(stop), ignore_eos=bool(ignore_eos),
                          stop_strings=stop_strings, do_sample=do_sample is not False, options=options)
