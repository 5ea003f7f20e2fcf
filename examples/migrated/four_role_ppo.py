"""four_role_ppo, migrated from the legacy coati.ray API to coati_relay.launch_distributed.

Written by `python -m coati_compat.migrate four_role_ppo.py`. The legacy command-line flags keep their names and
defaults; added: --num_episodes, --inference_backend, --report_to, --run_dir. Every `# NOTE:` says what happened to
a legacy setting without an exact counterpart, with a link into the migration guide.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Dict

# NOTE: NOT TRANSLATED: the script's own Ray actor classes (PolicyWorker, ValueWorker, ReferenceWorker,
#       RewardWorker) and its hand-written PPO loop (experience from object references, then a learning step per
#       group) are replaced by the engine's roles: producers sample, consumers score with the reference model and
#       the reward model, train the policy and the critic, and publish the weights. See
#       migration_guide/rewriter.md#custom-classes
# NOTE: @ray.remote(num_gpus=...) classes and their placement groups have no counterpart: launch_distributed places
#       its actors itself (placement_strategy). To smoke-test the legacy script itself on CPUs, run it with
#       `coati-relay legacy-run SCRIPT ...`. See migration_guide/rewriter.md#placement
# NOTE: --steps, --seed, --save_dir, --timeout_s are still accepted, so legacy command lines keep working, but have
#       no effect: what they set has no counterpart (see the other NOTEs). See
#       migration_guide/rewriter.md#unused-flags


LEGACY_STRATEGY_PLUGINS = {
    "naive": {"plugin": "ddp"},
    "ddp": {"plugin": "ddp"},
    "colossalai_gemini": {"plugin": "gemini", "pin_memory": True, "initial_scale": 32, "precision": "fp16"},
    "colossalai_zero2": {"plugin": "zero2", "precision": "fp16", "initial_scale": 65536},
    "colossalai_gemini_cpu": {
        "plugin": "gemini",
        "offload_optim_frac": 1.0,
        "offload_param_frac": 1.0,
        "pin_memory": True,
        "initial_scale": 32,
        "precision": "fp16",
    },
    "colossalai_zero2_cpu": {"plugin": "zero2", "precision": "fp16", "initial_scale": 65536, "cpu_offload": True},
}


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


def lora_config(rank, family):
    """train_model_config["lora"] for the legacy ``lora_rank`` (None for 0: full fine-tuning).

    The legacy scaling was ``1 / rank`` (``lora_alpha=1``); peft's is ``alpha / r``, hence ``alpha=1``.
    """
    if rank <= 0:
        return None
    return {"r": rank, "alpha": 1, "target_modules": LORA_TARGET_MODULES.get(family)}


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="four_role_ppo on coati_relay.launch_distributed")
    parser.add_argument("--prompt_csv", required=True)
    parser.add_argument("--strategy", choices=["ddp", "colossalai_zero2", "colossalai_gemini"], default="ddp")
    parser.add_argument("--model", choices=["gpt2", "opt"], default="gpt2")
    parser.add_argument("--pretrain", required=True)
    parser.add_argument("--reward_pretrain", default=None, help="the reward model's base (default: --pretrain)")
    parser.add_argument("--rm_path", default=None, help="state dict of a trained reward model (else a random head)")
    parser.add_argument("--workers_per_role", type=int, default=1)
    parser.add_argument("--lora_rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--prompt_tokens", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.0001)
    parser.add_argument("--kl_coef", type=float, default=0.1)
    parser.add_argument("--clip_eps", type=float, default=0.2)
    parser.add_argument("--value_clip", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--save_dir", default="four_role_ckpt")
    parser.add_argument("--timeout_s", type=float, default=600)
    parser.add_argument("--num_episodes", type=int, default=1, help="passes over the prompt file (the run length)")
    parser.add_argument(
        "--inference_backend", default="vllm", choices=["vllm", "transformers"], help="how producers generate")
    parser.add_argument(
        "--report_to", nargs="*", default=[], choices=["tensorboard", "wandb", "none"],
        help="trackers besides run_dir/metrics.jsonl")
    parser.add_argument("--run_dir", default=None, help="metrics and checkpoints go here")
    return parser


def launch_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """The keywords of launch_distributed for these command-line arguments."""
    num_producers = 1
    num_consumers = args.workers_per_role
    prompt_tokens = args.prompt_tokens
    inference_batch_size, inference_microbatch_size = round_sizes(
        num_producers, num_consumers, args.batch_size, args.batch_size, 1)
    reward_model_path = args.reward_pretrain or args.pretrain
    if args.rm_path:
        reward_model_path = legacy_reward_model(reward_model_path, args.rm_path)
    train_model_config = {"path": args.pretrain}
    lora = lora_config(args.lora_rank, args.model)
    if lora:
        train_model_config["lora"] = lora
    return dict(
        num_producers=num_producers,
        num_proc_per_producer=1,
        # NOTE: the four groups (policy, critic, reference, reward) become one producer and num_consumers consumers,
        #       one per rank of the policy group; each consumer holds the policy, the critic, the reference model
        #       and the reward model itself, so the critic/initial/reward group sizes have no counterpart. See
        #       migration_guide/rewriter.md#four-role
        num_consumer_procs=num_consumers,
        # NOTE: the script ran args.steps time steps, each sampling a batch per policy rank (prompts drawn at
        #       random); the engine's run length follows from the data: num_episodes passes over the prompt file,
        #       one round per inference_batch_size*num_producers prompts. See migration_guide/rewriter.md#run-length
        num_episodes=args.num_episodes,
        # NOTE: each policy rank sampled args.batch_size prompts per time step and learned on every experience batch
        #       of args.batch_size with one optimizer step, 1 time step(s) per learning stage; a round here holds 1
        #       such batch(es) per consumer. See migration_guide/rewriter.md#batch-sizes
        inference_batch_size=inference_batch_size,
        inference_microbatch_size=inference_microbatch_size,
        train_batch_size=args.batch_size,
        train_minibatch_size=args.batch_size,
        # NOTE: the legacy collate function cut or padded every prompt of the CSV's prompt column to exactly
        #       prompt_tokens tokens; the engine reads the same column (raw text, no chat template), pads per batch
        #       and cuts over-long prompts on the left, keeping their end. The data loader ran inside each maker;
        #       here the engine samples the prompts. (legacy line 104) See migration_guide/rewriter.md#dataset
        train_dataset_config={"path": args.prompt_csv, "max_length": prompt_tokens},
        inference_model_config={"path": args.pretrain},
        generate_config={"max_new_tokens": args.new_tokens},
        # NOTE: lora_rank -> train_model_config['lora'] (peft): rank r, alpha=1 (the legacy scaling was 1/r), the
        #       linear layers the legacy LoRA replaced (see lora_config); only the adapters train and are published
        #       to the producers. The engine's critic trains fully. See migration_guide/rewriter.md#lora
        # NOTE: --model (the model family) is no longer chosen: the checkpoint's config.json sets the architecture.
        #       See migration_guide/rewriter.md#models
        train_model_config=train_model_config,
        # NOTE: compute_reward subtracted kl_coef times a sequence-level KL estimate from the reward and the script
        #       used advantage = reward - value; the engine's PPO puts -kl_coef*KL on every response token and
        #       estimates advantages with GAE (gamma, lam in grpo_config). See
        #       migration_guide/rewriter.md#kl-and-advantages
        grpo_config={
            "lr": args.lr, "critic_lr": args.lr, "kl_coef": args.kl_coef, "clip_eps_low": args.clip_eps,
            "clip_eps_high": args.clip_eps, "value_clip": args.value_clip},
        # NOTE: strategies map to Booster plugins: naive and ddp -> 'ddp', colossalai_zero2 -> 'zero2',
        #       colossalai_gemini -> 'gemini' (fp16, as the legacy strategies). ZeRO and Gemini need CUDA: on a CPU
        #       host add 'allow_cpu_fallback': True to plugin_config to train with 'ddp'. See
        #       migration_guide/rewriter.md#trainer-strategy
        plugin_config=legacy_plugin_config(args.strategy),
        inference_backend=args.inference_backend,
        num_generations=1,
        core_algo="PPO",
        project_name="four_role_ppo",
        critic_model_config={"path": args.pretrain},
        # NOTE: the trained legacy reward model (args.rm_path: the state dict of the critic class's body and value
        #       head on args.reward_pretrain or args.pretrain) is written once as a sequence classifier with one
        #       label (legacy_reward_model), which the engine loads. The engine reads the score at the last real
        #       token, the legacy RewardModel the mean over all positions but the last: the same head gives other
        #       numbers. Without args.rm_path each side scores with a random head of its own. See
        #       migration_guide/rewriter.md#four-role
        reward_model_config={"path": reward_model_path},
        # NOTE: the policy's checkpoint goes to run_dir/checkpoints (RunResult.checkpoints), not to the script's
        #       save path. (legacy line 136) See migration_guide/rewriter.md#four-role
        run_dir=args.run_dir,
        report_to=args.report_to,
    )


def main(argv=None):
    from coati_relay import launch_distributed  # imported here: reading launch_kwargs stays cheap

    args = build_parser().parse_args(argv)
    result = launch_distributed(**launch_kwargs(args))
    print(result.summary)
    return result


if __name__ == "__main__":
    main()
