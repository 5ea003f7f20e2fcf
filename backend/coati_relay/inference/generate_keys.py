"""Which ``generate_config`` key each inference backend knows, and what this engine does with it.

ColossalChat (``coati.distributed``, 4f9953be3) hands ``generate_config`` whole to the backend in use: transformers'
``model.generate(**generate_config)`` or ``vllm.SamplingParams(**generate_config)``. A key keeps the meaning it has
in the backend in use; a key that backend does not know is an error (before any actor starts) that says which
backend knows it.

Per key, one of:
- ``engine``: read by the engine on both backends (`SamplingConfig` fields; where a backend has no such key, it is
  this engine's extension there: ``seed``, ``ignore_eos``, ``stop_token_ids`` on transformers, ``max_new_tokens`` on
  vLLM and ``max_tokens`` on transformers as each other's aliases).
- ``native``: a key of the backend in use that the engine runs itself with that backend's meaning (the transformers
  backend samples with its own decode loop, `coati_relay.inference.decode_loop`).
- ``passed``: handed unchanged to the backend (vLLM's ``SamplingParams``).
- ``forced``: a key the engine sets itself, as ColossalChat did (``n``, ``logprobs``): accepted, without effect.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

ENGINE_KEYS = ("max_new_tokens", "max_tokens", "temperature", "top_k", "top_p", "seed", "ignore_eos",
               "stop_token_ids")

# transformers generate() keys that the transformers backend's decode loop runs with transformers' meaning.
TRANSFORMERS_NATIVE = {
    "do_sample": "False decodes greedily (argmax), True samples",
    "max_length": "the whole sequence's length: the left-padded prompt (train_dataset_config['max_length'] tokens) "
                  "plus the response; max_new_tokens wins where both are given",
    "stop_strings": "a response ends with the token that completes one of these strings",
    "early_stopping": "beam search only: no effect with one beam, as in transformers",
    "num_beams": "must be 1 (sampling)",
    "use_cache": "a key/value cache is always used (no effect on the tokens)",
}
# Keys the engine sets itself, whatever is given (ColossalChat forces the same ones).
TRANSFORMERS_FORCED = {"output_logits": "log-probs always come back", "output_scores": "log-probs always come back",
                       "return_dict_in_generate": "the engine reads generate's output itself"}
VLLM_FORCED = {"n": "num_generations sets it (ColossalChat overrides it the same way)",
               "logprobs": "0, the sampled token's log-prob, is always asked for (ColossalChat forces 0 too)"}

# vllm.SamplingParams' public keywords (vLLM 0.32; tests/unit/test_generate_keys.py holds it to the installed one).
VLLM_SAMPLING_KEYS = (
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "watermarking", "top_p",
    "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs",
    "prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids", "flat_logprobs",
    "detokenize", "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "output_kind", "stream_interval", "skip_clone", "output_text_buffer_length", "structured_outputs",
    "logit_bias", "allowed_token_ids", "extra_args", "bad_words", "skip_reading_prefix_cache",
    "thinking_token_budget", "repetition_detection", "routed_experts_prompt_start", "trace_decode_token_ids")
# SamplingParams keywords that shape what the engine reads back: set by the engine only.
VLLM_ENGINE_OWNED = ("prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids",
                     "flat_logprobs", "detokenize", "output_kind", "stream_interval", "skip_clone",
                     "output_text_buffer_length", "routed_experts_prompt_start", "trace_decode_token_ids")
# The same idea under the other backend's name.
COUNTERPART = {"stop": "stop_strings", "stop_strings": "stop", "max_length": "max_tokens (new tokens only)",
               "do_sample": "temperature (0: greedy)", "min_tokens": "min_new_tokens",
               "min_new_tokens": "min_tokens"}


def transformers_generate_keys() -> Tuple[str, ...]:
    """The keys transformers' ``GenerationConfig`` knows (what ``model.generate(**kwargs)`` reads)."""
    from transformers import GenerationConfig

    return tuple(k for k in GenerationConfig().to_dict() if not k.startswith("_"))


def classify(backend: str, key: str) -> Tuple[str, Optional[str]]:
    """(``engine`` | ``native`` | ``passed`` | ``forced``, None) for a key ``backend`` takes, else ("error", why)."""
    if key in ENGINE_KEYS:
        return "engine", None
    in_tf, in_vllm = key in transformers_generate_keys(), key in VLLM_SAMPLING_KEYS
    if backend == "transformers":
        if key in TRANSFORMERS_NATIVE:
            return "native", None
        if key in TRANSFORMERS_FORCED:
            return "forced", None
        if in_tf:
            runs = sorted([*ENGINE_KEYS, *TRANSFORMERS_NATIVE])
            return "error", (f"a transformers generate() key that this engine's transformers backend does not run "
                             f"(it decodes with its own loop, which runs {runs}); drop it"
                             + (", or use inference_backend='vllm', which knows it" if in_vllm else ""))
    elif backend == "vllm":
        if key in VLLM_FORCED:
            return "forced", None
        if key in VLLM_ENGINE_OWNED:
            return "error", "a vllm.SamplingParams key the engine sets itself (it shapes what the engine reads back)"
        if in_vllm:
            return "passed", None
    other = "vllm" if backend == "transformers" else "transformers"
    knows = in_vllm if other == "vllm" else in_tf
    if knows:
        alt = COUNTERPART.get(key)
        return "error", (f"a {other} key (inference_backend='{other}' knows it); inference_backend='{backend}' does "
                         f"not" + (f": its counterpart there is {alt!r}" if alt else ""))
    return "error", "neither transformers' generate() nor vllm.SamplingParams knows it"


def split_generate_config(backend: str, gen: Dict[str, object]) -> Dict[str, Tuple[str, Optional[str]]]:
    """Every key of ``gen`` (None values included) with its `classify` result for ``backend``."""
    return {k: classify(backend, k) for k in gen}
