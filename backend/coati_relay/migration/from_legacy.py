"""Legacy ``coati.ray`` settings in this engine's terms: what scripts written by ``coati-relay migrate`` import.

A migrated script keeps the legacy command-line flags and computes ``launch_distributed``'s keywords from them with
these functions (``coati-relay docs rewriter`` explains each mapping):

- `legacy_plugin_config`: a legacy ``--trainer_strategy`` name -> ``plugin_config`` (`LEGACY_STRATEGY_PLUGINS`);
- `round_sizes`: the legacy batch sizes and push interval -> ``inference_batch_size``, ``inference_microbatch_size``;
- `episodes_for_rounds`: a legacy step count -> ``num_episodes`` for a prompt file;
- `max_new_tokens`: the legacy ``max_length`` (prompt and response) -> the response length;
- `lora_config`: the legacy ``lora_rank`` -> ``train_model_config["lora"]``;
- `legacy_reward_model`: a legacy ``RewardModel`` state dict -> a checkpoint for ``reward_model_config["path"]``;
- `count_prompts`: the prompts in a .csv or .jsonl file.

Importing this module imports nothing but the standard library (torch and transformers only inside
`legacy_reward_model`), so reading a migrated script's keywords stays cheap.
"""
from __future__ import annotations

import csv
import math
import os

# Legacy --trainer_strategy -> plugin_config: the settings the legacy strategy picked that its plugin would not pick
# by itself (the legacy fp16 and loss scale of ZeRO and Gemini). Written from coati_compat's table of the legacy
# strategies; a test checks that they agree.
LEGACY_STRATEGY_PLUGINS = {
    "naive": {"plugin": "ddp"},
    "ddp": {"plugin": "ddp"},
    "colossalai_gemini": {"plugin": "gemini", "pin_memory": True, "initial_scale": 32, "precision": "fp16"},
    "colossalai_zero2": {"plugin": "zero2", "precision": "fp16", "initial_scale": 65536},
    "colossalai_gemini_cpu": {"plugin": "gemini", "offload_optim_frac": 1.0, "offload_param_frac": 1.0,
                              "pin_memory": True, "initial_scale": 32, "precision": "fp16"},
    "colossalai_zero2_cpu": {"plugin": "zero2", "precision": "fp16", "initial_scale": 65536, "cpu_offload": True},
}

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


def count_prompts(path):
    """Prompts in a ``.csv`` (rows under the header) or ``.jsonl`` (non-empty lines) file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompt file {path} does not exist; pass the path of a .csv or .jsonl prompt file")
    with open(path, encoding="utf-8", newline="") as f:
        if str(path).lower().endswith(".csv"):
            return max(sum(1 for _ in csv.reader(f)) - 1, 0)
        return sum(1 for line in f if line.strip())


def episodes_for_rounds(rounds, prompt_path, prompts_per_round):
    """num_episodes for a run of at least ``rounds`` rounds (weight versions) over ``prompt_path``.

    A legacy script that ran N steps (each one weight version) drew its prompts at random; the engine makes
    ``prompts // prompts_per_round`` rounds per pass over the file (``prompts_per_round``:
    inference_batch_size*num_producers), so the run is N rounds rounded up to whole passes.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"the number of steps must be a positive int, got {rounds!r}")
    per_episode = count_prompts(prompt_path) // prompts_per_round
    if per_episode < 1:
        raise ValueError(f"{prompt_path} holds fewer prompts than one round takes ({prompts_per_round}); add "
                         f"prompts or lower the batch size")
    return -(-rounds // per_episode)


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
    """The checkpoint directory for ``reward_model_config["path"]``: ``base_path`` where ``state_dict_path`` is None,
    else one written from the legacy ``RewardModel`` state dict there.

    The legacy reward model was ``base_path``'s transformer body plus a ``value_head`` (``nn.Linear(hidden, 1)``),
    trained and saved as one state dict (keys ``model.*`` and ``value_head.*``) at ``state_dict_path``. The engine
    loads a sequence classifier with one label: this writes the body and the head (``score``) as one next to the
    state dict, ``<state_dict_path>.relay/``, once (again when the state dict is newer), and returns that path.
    The classifier's head has no bias: a nonzero legacy bias shifts every score by a constant (a warning says so).
    """
    if state_dict_path is None:
        return base_path
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
