"""dummy_throughput, migrated from the legacy coati.ray API to coati_relay.launch_distributed.

Written by `coati-relay migrate dummy_throughput.py`. The legacy flags keep their names and defaults; added:
--prompt_path, --reward_model_path, --lr, --num_episodes, --inference_backend, --report_to, --run_dir. A `# NOTE:`
marks each legacy setting without an exact counterpart, with the command that explains it.
"""
from __future__ import annotations

import argparse
from typing import Any, Dict

from coati_relay.migration.from_legacy import legacy_plugin_config, max_new_tokens, round_sizes

# NOTE: .options(max_concurrency, name, num_gpus) on the legacy actors has no counterpart: launch_distributed
#       creates and places its actors itself (a GPU each where the cluster has enough, CPU shares otherwise).
#       (`coati-relay docs placement`)
# NOTE: ray.init(...) is not needed: launch_distributed starts Ray when it is not running, and no RAY_NAMESPACE is
#       read (the engine's actors are not looked up by name). (legacy line 143) (`coati-relay docs placement`)
# NOTE: env_info (rank, world size, master address and port) has no counterpart: the engine sets up the consumers'
#       process group itself. (legacy line 74) (`coati-relay docs env-info`)
# NOTE: sync_models_from_trainers: producers always start from the weights the consumers publish first (version 0).
#       (legacy line 74) (`coati-relay docs initial-sync`)
# NOTE: eval_performance: throughput and timings are always measured: RunResult.summary and the history
#       (samples_per_s, generate_s, train_s, weight_sync_s). (legacy line 74) (`coati-relay docs callbacks`)
# NOTE: do_sample: the engine always samples (temperature, top_k, top_p). (legacy line 74)
#       (`coati-relay docs generation`)
# NOTE: pad_token_id/eos_token_id: taken from the tokenizer saved with the model; each response ends at its EOS
#       token. (legacy line 74) (`coati-relay docs generation`)
# NOTE: buffer_limit=16: the engine's queue holds at most (n_behind + 1) rounds of rollouts and blocks producers
#       beyond that (legacy makers were never throttled); n_behind=0, the default, keeps training on-policy. (legacy
#       line 93) (`coati-relay docs buffer`)
# NOTE: sync_models_to_remote_makers() is not needed: producers always start from the weights the consumers publish
#       first (version 0). (legacy line 109) (`coati-relay docs initial-sync`)
# NOTE: --maker_strategy, --model, --experience_steps are still accepted, so legacy command lines keep working, but
#       have no effect: what they set has no counterpart (see the other NOTEs). (`coati-relay docs unused-flags`)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="dummy_throughput on coati_relay.launch_distributed")
    parser.add_argument("--num_makers", type=int, default=1)
    parser.add_argument("--num_trainers", type=int, default=1)
    parser.add_argument(
        "--trainer_strategy", default="ddp",
        choices=[
            "naive", "ddp", "colossalai_gemini", "colossalai_zero2", "colossalai_gemini_cpu", "colossalai_zero2_cpu"]
    )
    parser.add_argument("--maker_strategy", default="naive", choices=["naive"])
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "bloom", "opt", "llama"])
    parser.add_argument("--pretrain", required=True, help="directory of a model config and its tokenizer")
    parser.add_argument("--experience_steps", type=int, default=4)
    parser.add_argument("--experience_batch_size", type=int, default=8)
    parser.add_argument("--train_batch_size", type=int, default=8)
    parser.add_argument("--update_steps", type=int, default=2)
    parser.add_argument("--train_epochs", type=int, default=1)
    parser.add_argument("--prompt_tokens", type=int, default=128)
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--save_dir", default=None)
    parser.add_argument(
        "--prompt_path", required=True, help="prompt file: a .csv with a prompt column, or ColossalChat .jsonl")
    parser.add_argument("--reward_model_path", required=True, help="local checkpoint of the reward model")
    parser.add_argument("--lr", type=float, default=1e-07, help="learning rate of actor and critic")
    parser.add_argument("--num_episodes", type=int, default=1, help="passes over the prompt file (the run length)")
    parser.add_argument("--inference_backend", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--report_to", nargs="*", default=[], choices=["tensorboard", "wandb", "none"])
    parser.add_argument("--run_dir", default=None, help="metrics and checkpoints go here")
    return parser


def launch_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """The keywords of launch_distributed for these command-line arguments."""
    num_producers = args.num_makers
    num_consumers = args.num_trainers
    inference_batch_size, inference_microbatch_size = round_sizes(
        num_producers, num_consumers, args.experience_batch_size, args.train_batch_size, args.update_steps)
    prompt_tokens = args.prompt_tokens
    return dict(
        # NOTE: detached_trainer_name_list and experience_maker_holder_name_list and get_receivers_per_sender have
        #       no counterpart: every consumer reads one shared rollout queue, so there are no actor names or routes
        #       to compute. (`coati-relay docs routing`)
        num_producers=num_producers,
        num_proc_per_producer=1,
        num_consumer_procs=num_consumers,
        # NOTE: each maker made workingloop(num_steps=args.experience_steps) batches; each trainer trained
        #       fit(total_steps=args.experience_batch_size * args.experience_steps * args.num_makers //
        #       (args.num_trainers * args.train_batch_size), update_steps=args.update_steps) batches; that is 4
        #       batches per trainer, 32 samples in all (flags at their defaults). The engine's run length follows
        #       from the data: num_episodes * (prompts in the file // (inference_batch_size*num_producers)) rounds;
        #       set --num_episodes (and the file's size) to match. (legacy line 114) (`coati-relay docs run-length`)
        num_episodes=args.num_episodes,
        # NOTE: train_batch_size counts prompts; with one response per prompt (num_generations=1) that is the legacy
        #       count of samples. A round (one weight version) is inference_batch_size*num_producers prompts, sized
        #       to hold what the legacy trainers consumed between two weight pushes
        #       (update_steps*train_batch_size*num_trainers samples) and rounded up until the engine's sizes tile.
        #       With the legacy defaults: 16*1 = 16 prompts per round, 2 optimizer step(s) per consumer per weight
        #       version (legacy: a push every 2 batch(es)); the prompt file needs at least 16 prompts.
        #       (`coati-relay docs batch-sizes`)
        inference_batch_size=inference_batch_size,
        inference_microbatch_size=inference_microbatch_size,
        train_batch_size=args.train_batch_size,
        train_minibatch_size=args.train_batch_size,
        # NOTE: the legacy script fed random token ids (a throughput benchmark); the engine reads prompts from a
        #       file: pass --prompt_path. (`coati-relay docs dataset`)
        train_dataset_config={"path": args.prompt_path, "max_length": prompt_tokens},
        # NOTE: ExperienceMakerHolder's model_fn: could not read which model it builds for actor. (legacy line 74)
        #       (`coati-relay docs unread`)
        # NOTE: model families (args.model) are no longer chosen: every model is a local Hugging Face checkpoint
        #       whose config.json sets the architecture. The reward model loads as a sequence classifier with one
        #       label, the critic as the checkpoint's trunk plus a value head. (`coati-relay docs models`)
        # NOTE: the legacy actor, critic had random weights of the shape of args.pretrain's config (AutoConfig); the
        #       engine loads that checkpoint's weights. (`coati-relay docs models`)
        # NOTE: --pretrain defaults to None, which legacy read as 'random weights of a default-size model'; the
        #       engine needs a local checkpoint directory: pass --pretrain. (`coati-relay docs models`)
        # NOTE: the maker's strategy_fn has no counterpart: producers generate with the inference backend
        #       (--inference_backend) and need no training strategy. (legacy line 74)
        #       (`coati-relay docs maker-strategy`)
        inference_model_config={"path": args.pretrain},
        # NOTE: max_length counted prompt and response together (prompts were padded to prompt_tokens);
        #       max_new_tokens counts the response only, so it is max_length - prompt_tokens.
        #       (`coati-relay docs generation`)
        # NOTE: top_k/top_p: the producers sample from the truncated distribution, as the legacy maker did, and
        #       report its log-probs; the losses need those of the full distribution, which the legacy maker
        #       computed with an actor forward. The consumers recompute them the same way, one forward without
        #       gradient per round; drop top_k/top_p to save it. (`coati-relay docs generation`)
        generate_config={
            "max_new_tokens": max_new_tokens(args.max_length, prompt_tokens), "temperature": 1.0, "top_k": 50},
        train_model_config={"path": args.pretrain},
        # NOTE: DetachedPPOTrainer hard-coded lr=1e-07 for the actor and the critic; it is the default of --lr here
        #       (grpo_config lr and critic_lr). (`coati-relay docs learning-rate`)
        # NOTE: kl_coef: the legacy maker subtracted kl_coef times a sequence-level KL estimate from the reward and
        #       used advantage = reward - value; the engine's PPO puts -kl_coef*KL on every response token and
        #       estimates advantages with GAE (gamma, lam in grpo_config). (`coati-relay docs kl-and-advantages`)
        # NOTE: train_epochs -> grpo_config['ppo_epochs']: legacy replayed an episode's update_steps batches
        #       (shuffled) for train_epochs - 1 more epochs before pushing the weights; the engine passes over a
        #       round's batches ppo_epochs times, in order, before publishing a weight version. (legacy line 114)
        #       (`coati-relay docs train-epochs`)
        grpo_config={"lr": args.lr, "critic_lr": args.lr, "kl_coef": 0.1, "ppo_epochs": args.train_epochs},
        # NOTE: strategies map to Booster plugins with the settings the legacy strategy picks (one table,
        #       coati_compat.legacy.tables): naive and ddp -> 'ddp', colossalai_zero2 -> 'zero2', colossalai_gemini
        #       -> 'gemini'; the _cpu variants offload to CPU (cpu_offload, offload_*_frac). ZeRO and Gemini keep
        #       the legacy fp16 and loss scale (the plugins default to bf16); settings the plugin picks by itself
        #       are left out of the table. Both need CUDA: on a CPU host add 'allow_cpu_fallback': True to
        #       plugin_config to train with 'ddp'. (`coati-relay docs trainer-strategy`)
        plugin_config=legacy_plugin_config(args.trainer_strategy),
        inference_backend=args.inference_backend,
        num_generations=1,
        core_algo="PPO",
        project_name="dummy_throughput",
        critic_model_config={"path": args.pretrain},
        # NOTE: no checkpoint path was found for the reward model; pass --reward_model_path.
        #       (`coati-relay docs models`)
        reward_model_config={"path": args.reward_model_path},
        run_dir=args.run_dir,
        # NOTE: the legacy script saved its outputs in --save_dir; the engine's checkpoints go to
        #       save_dir/checkpoints/step-NNNNNN (under run_dir when None). (`coati-relay docs seed-and-save-dir`)
        save_dir=args.save_dir,
        report_to=args.report_to,
    )


def main(argv=None):
    from coati_relay import launch_distributed  # imported here: reading launch_kwargs stays cheap

    result = launch_distributed(**launch_kwargs(build_parser().parse_args(argv)))
    print(result.summary)
    return result


if __name__ == "__main__":
    main()
