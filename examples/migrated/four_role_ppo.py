"""four_role_ppo, migrated from the legacy coati.ray API to coati_relay.launch_distributed.

Written by `coati-relay migrate four_role_ppo.py`. The legacy flags keep their names and defaults; added:
--num_episodes, --inference_backend, --report_to, --run_dir. A `# NOTE:` marks each legacy setting without an exact
counterpart, with the command that explains it.
"""
from __future__ import annotations

import argparse
from typing import Any, Dict

from coati_relay.migration.from_legacy import (episodes_for_rounds, legacy_plugin_config, legacy_reward_model,
                                               lora_config, round_sizes)

# NOTE: NOT TRANSLATED: the script's Ray actors (PolicyWorker, ValueWorker, ReferenceWorker, RewardWorker) and
#       hand-written PPO loop: the engine's roles replace them. (`coati-relay docs custom-classes`)
# NOTE: @ray.remote(num_gpus=...) classes and placement groups: launch_distributed places its actors itself;
#       `coati-relay legacy-run SCRIPT ...` runs the legacy script on CPUs. (`coati-relay docs placement`)


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
    parser.add_argument(
        "--num_episodes", type=int, default=None, help="prompt file passes (default: enough for --steps)")
    parser.add_argument("--inference_backend", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--report_to", nargs="*", default=[], choices=["tensorboard", "wandb", "none"])
    parser.add_argument("--run_dir", default=None, help="metrics and checkpoints go here")
    return parser


def launch_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """The keywords of launch_distributed for these command-line arguments."""
    num_producers = 1
    num_consumers = args.workers_per_role
    prompt_tokens = args.prompt_tokens
    inference_batch_size, inference_microbatch_size = round_sizes(
        num_producers, num_consumers, args.batch_size, args.batch_size, 1)
    num_episodes = args.num_episodes or episodes_for_rounds(
        args.steps, args.prompt_csv, inference_batch_size * num_producers)
    return dict(
        num_producers=num_producers,
        num_proc_per_producer=1,
        # NOTE: the four groups become one producer and num_consumers consumers (one per policy rank), each holding
        #       all four models: the other groups' sizes have no counterpart. (`coati-relay docs four-role`)
        num_consumer_procs=num_consumers,
        # NOTE: args.steps time steps (one weight version each, prompts drawn at random) become args.steps rounds,
        #       rounded up to whole passes over the prompt file. (`coati-relay docs run-length`)
        num_episodes=num_episodes,
        # NOTE: each policy rank took an optimizer step per batch of args.batch_size prompts, 1 batch(es) per
        #       learning stage: a round holds as many per consumer. (`coati-relay docs batch-sizes`)
        inference_batch_size=inference_batch_size,
        inference_microbatch_size=inference_microbatch_size,
        train_batch_size=args.batch_size,
        train_minibatch_size=args.batch_size,
        # NOTE: the legacy collate (in each maker) cut or padded each prompt to exactly prompt_tokens tokens; the
        #       engine samples the same CSV column (raw text, no chat template), pads per batch and keeps an
        #       over-long prompt's first prompt_tokens. (legacy line 104) (`coati-relay docs dataset`)
        train_dataset_config={"path": args.prompt_csv, "max_length": prompt_tokens},
        inference_model_config={"path": args.pretrain},
        generate_config={"max_new_tokens": args.new_tokens},
        # NOTE: lora_rank -> train_model_config['lora'] (peft, alpha=1: the legacy 1/r scaling): only the adapters
        #       train and are published; the critic trains fully. (`coati-relay docs lora`)
        # NOTE: --model: the checkpoint's config.json sets the architecture. (`coati-relay docs models`)
        train_model_config={"path": args.pretrain, "lora": lora_config(args.lora_rank, args.model)},
        # NOTE: compute_reward's sequence-level KL penalty and advantage = reward - value become -kl_coef*KL on
        #       every response token and GAE (gamma, lam in grpo_config). (`coati-relay docs kl-and-advantages`)
        grpo_config={
            "lr": args.lr, "critic_lr": args.lr, "kl_coef": args.kl_coef, "clip_eps_low": args.clip_eps,
            "clip_eps_high": args.clip_eps, "value_clip": args.value_clip},
        # NOTE: ddp, colossalai_zero2 and colossalai_gemini -> the plugins 'ddp', 'zero2' and 'gemini' (fp16 as
        #       before); the last two need CUDA. (`coati-relay docs trainer-strategy`)
        plugin_config=legacy_plugin_config(args.strategy),
        inference_backend=args.inference_backend,
        num_generations=1,
        core_algo="PPO",
        project_name="four_role_ppo",
        critic_model_config={"path": args.pretrain},
        # NOTE: args.rm_path (a legacy RewardModel's state dict on args.reward_pretrain or args.pretrain) becomes a
        #       one-label sequence classifier (legacy_reward_model) scoring the last real token, where the legacy
        #       one averaged the positions; without it each side has a random head. (`coati-relay docs four-role`)
        reward_model_config={"path": legacy_reward_model(args.reward_pretrain or args.pretrain, args.rm_path)},
        run_dir=args.run_dir,
        # NOTE: the legacy script saved the policy's state dict (actor.pt) in --save_dir; the engine's checkpoints
        #       go to save_dir/checkpoints/step-NNNNNN. (`coati-relay docs seed-and-save-dir`)
        save_dir=args.save_dir,
        seed=args.seed,
        timeout_s=args.timeout_s,
        report_to=args.report_to,
    )


def main(argv=None):
    from coati_relay import launch_distributed  # imported here: reading launch_kwargs stays cheap

    result = launch_distributed(**launch_kwargs(build_parser().parse_args(argv)))
    print(result.summary)
    return result


if __name__ == "__main__":
    main()
