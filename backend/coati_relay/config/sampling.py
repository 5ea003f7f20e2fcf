"""``generate_config``: how producers sample, checked key by key into a `SamplingConfig`.

A key given as None counts as not given (ColossalChat's transformers example passes ``max_new_tokens=None``).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping

from coati_relay.config.checks import is_int, is_number
from coati_relay.config.keys import IGNORED_SECTION_KEYS, check_section_keys
from coati_relay.inference.base import SamplingConfig

GENERATE_KEYS = ("max_new_tokens", "max_tokens", "temperature", "top_k", "top_p", "seed", "ignore_eos",
                 "stop_token_ids")
DEFAULT_MAX_NEW_TOKENS = 16

log = logging.getLogger(__name__)


def _max_new_tokens(errors: List[str], gen: Mapping[str, Any], grpo: Mapping[str, Any]) -> int:
    """The response length: generate_config's max_new_tokens or max_tokens (vLLM's name), else grpo_config's."""
    given = {f"generate_config['{k}']": gen[k] for k in ("max_new_tokens", "max_tokens") if gen.get(k) is not None}
    if not given and grpo.get("max_new_tokens") is not None:
        given["grpo_config['max_new_tokens']"] = grpo["max_new_tokens"]
    if len(set(map(repr, given.values()))) > 1:
        errors.append(f"{' and '.join(given)} disagree ({list(given.values())}); give one of them")
    for name, value in given.items():
        if not is_int(value) or value < 1:
            errors.append(f"{name} must be an int >= 1 (tokens per response), got {value!r}")
            return DEFAULT_MAX_NEW_TOKENS
    return next(iter(given.values()), DEFAULT_MAX_NEW_TOKENS)


def build_sampling(errors: List[str], gen: Dict[str, Any], grpo: Mapping[str, Any]) -> SamplingConfig:
    """The checked `SamplingConfig` of ``generate_config``; problems go to ``errors`` (defaults stand in)."""
    check_section_keys(errors, "generate_config", gen, GENERATE_KEYS, IGNORED_SECTION_KEYS["generate_config"])
    max_new = _max_new_tokens(errors, gen, grpo)
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
    elif not is_int(top_k) or (top_k < 1 and top_k != -1):
        errors.append(f"generate_config['top_k'] must be -1 (off) or an int >= 1, got {top_k!r}")
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
    return SamplingConfig(max_new_tokens=max_new, temperature=float(temperature), top_k=top_k, top_p=float(top_p),
                          seed=seed, stop_token_ids=list(stop), ignore_eos=bool(ignore_eos))
