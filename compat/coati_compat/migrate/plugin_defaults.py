"""Tables and functions the rewriter copies, verbatim, into every migrated script that needs them.

A migrated script depends on ``coati_relay`` only, never on this package (the legacy surface goes away); keeping
the helpers here lets the rewriter and its tests use the very code the migrated scripts run.
"""
from __future__ import annotations

import math

from coati_compat.legacy.tables import LEGACY_STRATEGIES, plugin_config
from coati_relay.parts import PLUGINS

# colossalai 0.5's constructor defaults of the options the legacy strategies set (a test checks them against the
# installed colossalai): what a plugin_config that leaves such an option out trains with.
COLOSSALAI_DEFAULTS = {
    "zero2": {"stage": 1, "precision": "fp16", "initial_scale": 2 ** 32, "growth_factor": 2, "backoff_factor": 0.5,
              "growth_interval": 1000, "hysteresis": 2, "min_scale": 1, "max_scale": 2 ** 32, "norm_type": 2.0,
              "reduce_bucket_size_in_m": 12, "overlap_communication": True, "cpu_offload": False},
    "gemini": {"precision": "fp16", "placement_policy": "static", "shard_param_frac": 1.0, "offload_optim_frac": 0.0,
               "offload_param_frac": 0.0, "search_range_m": 32, "min_chunk_size_m": 32, "pin_memory": False,
               "force_outputs_fp32": False, "hidden_dim": None, "gpu_margin_mem_ratio": 0.0,
               "initial_scale": 2 ** 16, "growth_factor": 2, "backoff_factor": 0.5, "growth_interval": 1000,
               "hysteresis": 2, "min_scale": 1, "max_scale": 2 ** 32, "norm_type": 2.0},
}


def beyond_defaults(config):
    """``config`` (a plugin_config) without the settings its plugin gets anyway: those equal to the engine's plugin
    defaults or, where the engine sets none, to colossalai's."""
    plugin = config["plugin"]
    defaults = {**COLOSSALAI_DEFAULTS.get(plugin, {}), **PLUGINS[plugin].defaults}
    return {k: v for k, v in config.items() if k == "plugin" or k not in defaults or defaults[k] != v}


# Legacy --trainer_strategy -> plugin_config, from the one table of legacy strategies: the settings the legacy
# strategy picks that its plugin would not pick by itself.
LEGACY_STRATEGY_PLUGINS = {name: beyond_defaults(plugin_config(name)) for name in LEGACY_STRATEGIES}

# Legacy LoRA replaced every nn.Linear of the model (GPT-2's attention and MLP are Conv1D, so only its lm_head).
LORA_TARGET_MODULES = {
    "gpt2": ["lm_head"],
    "bloom": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h", "lm_head"],
    "opt": ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2", "lm_head"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"],
}


def legacy_plugin_config(strategy):
    """plugin_config for a legacy strategy name (``ddp``, ``colossalai_zero2``, ``colossalai_gemini``, ...)."""
    if strategy not in LEGACY_STRATEGY_PLUGINS:
        raise ValueError(f"unknown legacy trainer strategy {strategy!r}; "
                         f"use one of {sorted(LEGACY_STRATEGY_PLUGINS)}")
    return dict(LEGACY_STRATEGY_PLUGINS[strategy])


def round_sizes(num_producers, num_consumers, experience_batch_size, train_batch_size, update_steps):
    """(inference_batch_size, inference_microbatch_size) in prompts, one response per prompt.

    A round (one weight version) should hold what the legacy trainers consumed between two weight pushes,
    ``update_steps * train_batch_size * num_consumers`` samples, so that every consumer makes ``update_steps``
    optimizer steps per round. The round is rounded up until the engine's sizes tile: the micro-batch divides
    ``inference_batch_size`` and divides (or is a multiple of) ``train_batch_size``; the round splits into whole
    optimizer batches and whole micro-batches per consumer.
    """
    for name, value in (("num_producers", num_producers), ("num_consumers", num_consumers),
                        ("experience_batch_size", experience_batch_size), ("train_batch_size", train_batch_size),
                        ("update_steps", update_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    micro = experience_batch_size
    if train_batch_size % micro and micro % train_batch_size:
        micro = math.gcd(experience_batch_size, train_batch_size)
    target = update_steps * train_batch_size * num_consumers
    tile = math.lcm(train_batch_size * num_consumers, micro * num_consumers)
    per_producer = tile // math.gcd(tile, num_producers)  # smallest producer share whose round tiles
    step = math.lcm(per_producer, micro)
    batch = step * max(1, -(-target // (step * num_producers)))
    return batch, micro


def max_new_tokens(max_length, prompt_tokens):
    """The legacy ``max_length`` counted prompt and response together (prompts padded to ``prompt_tokens``)."""
    if max_length <= prompt_tokens:
        raise ValueError(f"max_length={max_length} leaves no room for a response after {prompt_tokens} prompt "
                         f"tokens; pass a larger --max_length")
    return max_length - prompt_tokens


def lora_config(rank, family):
    """train_model_config["lora"] for the legacy ``lora_rank`` (None for 0: full fine-tuning).

    The legacy scaling was ``1 / rank`` (``lora_alpha=1``); peft's is ``alpha / r``, hence ``alpha=1``.
    """
    if rank <= 0:
        return None
    return {"r": rank, "alpha": 1, "target_modules": LORA_TARGET_MODULES.get(family)}


def legacy_reward_model(base_path, state_dict_path):
    """A reward-model checkpoint directory for ``reward_model_config["path"]``, from a legacy ``RewardModel``.

    The legacy reward model was ``base_path``'s transformer body plus a ``value_head`` (``nn.Linear(hidden, 1)``),
    trained and saved as one state dict (keys ``model.*`` and ``value_head.*``) at ``state_dict_path``. The engine
    loads a sequence classifier with one label: this writes the body and the head (``score``) as one next to the
    state dict, ``<state_dict_path>.relay/``, once (again when the state dict is newer), and returns that path.
    The classifier's head has no bias: a nonzero legacy bias shifts every score by a constant (a warning says so).
    """
    import os
    import warnings

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    out = f"{state_dict_path}.relay"
    config = os.path.join(out, "config.json")
    if os.path.isfile(config) and os.path.getmtime(config) >= os.path.getmtime(state_dict_path):
        return out
    state = torch.load(state_dict_path, map_location="cpu")
    if "value_head.weight" not in state:
        raise ValueError(f"{state_dict_path} holds no 'value_head.weight': pass the state dict of a legacy "
                         f"RewardModel (keys model.* and value_head.*)")
    head, bias = state["value_head.weight"], state.get("value_head.bias")
    other = sorted(k for k in state if "lora_" in k or not k.startswith(("model.", "value_head.")))
    if other:
        raise ValueError(f"{state_dict_path} has keys other than the model's and the value head's weights "
                         f"({other[:3]} ...): a LoRA reward model must be merged into its weights first")
    verbosity, bars = transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()  # the head is "newly initialized": it is set from the state dict
    transformers_logging.disable_progress_bar()
    try:
        model = AutoModelForSequenceClassification.from_pretrained(base_path, num_labels=1, dtype=torch.float32)
        body = getattr(model, model.base_model_prefix)
        missing, _ = body.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")},
                                          strict=False)
        if missing:
            raise ValueError(f"{state_dict_path} lacks weights of the {type(body).__name__} at {base_path} "
                             f"({missing[:3]} ...): pass the base the reward model was trained from")
        model.score.weight.data.copy_(head.reshape(model.score.weight.shape))
        tokenizer = AutoTokenizer.from_pretrained(base_path)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (
                tokenizer.eos_token_id)
        model.save_pretrained(out)
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bars:
            transformers_logging.enable_progress_bar()
    if bias is not None and bias.abs().max().item() > 0:
        warnings.warn(f"the legacy reward head's bias {bias.flatten().tolist()} has no counterpart: the migrated "
                      f"scores are shifted by it")
    tokenizer.save_pretrained(out)
    return out
