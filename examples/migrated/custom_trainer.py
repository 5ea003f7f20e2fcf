"""custom_trainer, migrated from the legacy coati.ray API to coati_relay.launch_distributed.

Written by `coati-relay migrate custom_trainer.py`. The legacy flags keep their names and defaults; added:
--num_episodes, --inference_backend, --report_to, --run_dir. A `# NOTE:` marks each legacy setting without an exact
counterpart, with the command that explains it.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Dict

from coati_relay.algorithms import masked_mean
from coati_relay.migration.from_legacy import max_new_tokens, round_sizes

# NOTE: the callback class MetricsWriter(TrainerCallback) is carried as a hook class below and passed as
#       launch_distributed(callbacks=[...]) in main(). (legacy line 37) (`coati-relay docs custom-classes`)
# NOTE: .options(max_concurrency, name, num_gpus) on the legacy actors has no counterpart: launch_distributed
#       creates and places its actors itself (a GPU each where the cluster has enough, CPU shares otherwise).
#       (`coati-relay docs placement`)
# NOTE: ray.init(...) is not needed: launch_distributed starts Ray when it is not running, and no RAY_NAMESPACE is
#       read (the engine's actors are not looked up by name). (legacy line 164) (`coati-relay docs placement`)
# NOTE: do_sample: the engine always samples (temperature, top_k, top_p). (legacy line 102)
#       (`coati-relay docs generation`)
# NOTE: pad_token_id/eos_token_id: taken from the tokenizer saved with the model; each response ends at its EOS
#       token. (legacy line 102) (`coati-relay docs generation`)
# NOTE: buffer_limit=4: the engine's queue holds at most (n_behind + 1) rounds of rollouts and blocks producers
#       beyond that (legacy makers were never throttled); n_behind=0, the default, keeps training on-policy. (legacy
#       line 117) (`coati-relay docs buffer`)
# NOTE: --model, --experience_steps are still accepted, so legacy command lines keep working, but have no effect:
#       what they set has no counterpart (see the other NOTEs). (`coati-relay docs unused-flags`)


class MetricsWriter:
    """Appends one JSON line per training step to ``path``."""

    def __init__(self, path):
        self.path = path
        self.step = 0

    # NOTE: on_batch_end(metrics, experience) -> on_round_end(step, metrics) (legacy line 44).
    #       (`coati-relay docs custom-classes`)
    # NOTE: the engine calls it once a round (one weight version, after all of the round's optimizer steps) with the
    #       round's metrics record; the line below rebuilds the legacy training step's metrics from it.
    #       (`coati-relay docs custom-classes`)
    def on_round_end(self, step, metrics):
        metrics = {"pg_loss": metrics["loss"], "reward": metrics["reward"]}
        self.step += 1
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": self.step, **metrics}) + '\n')


def detached_pg_trainer_loss(logp, old_logp, advantages, mask, num_samples, **options):
    """DetachedPGTrainer.training_step (legacy line 62) as a policy loss, registered as 'DetachedPGTrainer'.

    logp, old_logp, mask: [B,T] (mask 1 on response tokens); advantages: [B,1] or [B,T]; num_samples:
    samples of the whole optimizer step. Returns (scalar loss, stats).
    """
    # NOTE: `self.actor.train()` (line 63): dropped; the learner sets train mode, runs the backward pass, the
    #       optimizer step and zero_grad itself. (`coati-relay docs custom-classes`)
    # NOTE: `num_actions = experience.action_mask.size(1)` (line 64): dropped; nothing reads it once the learner
    #       computes the model's output. (`coati-relay docs custom-classes`)
    # NOTE: `loss.backward()` (line 68): dropped; the learner sets train mode, runs the backward pass, the optimizer
    #       step and zero_grad itself. (`coati-relay docs custom-classes`)
    # NOTE: `self.actor_optim.step()` (line 69): dropped; the learner sets train mode, runs the backward pass, the
    #       optimizer step and zero_grad itself. (`coati-relay docs custom-classes`)
    # NOTE: `self.actor_optim.zero_grad()` (line 70): dropped; the learner sets train mode, runs the backward pass,
    #       the optimizer step and zero_grad itself. (`coati-relay docs custom-classes`)
    # NOTE: `return {...}` (line 71) -> `return loss, {}`: the engine logs pg_loss as 'loss', reward as 'reward' in
    #       its metrics; the carried hooks get them back under the legacy names. (`coati-relay docs custom-classes`)
    # NOTE: `log_probs = self.actor(experience.sequences, num_actions, attention_mask=experience.attention_mask)`
    #       (line 65) -> `log_probs = logp`: the learner computes the policy's log-probs of the response tokens
    #       (logp [B,T], with grad) before it calls the loss. (`coati-relay docs custom-classes`)
    log_probs = logp
    # NOTE: `seq_log_probs = masked_mean(log_probs, experience.action_mask, dim=1)` (line 66): the experience's
    #       fields are the loss's arguments. (`coati-relay docs custom-classes`)
    seq_log_probs = masked_mean(log_probs, mask, dim=1)
    # NOTE: `loss = -(experience.advantages.squeeze(-1) * seq_log_probs).mean()` (line 67): each batch mean becomes
    #       a sum over this micro-batch divided by num_samples (the samples of the whole optimizer step); that is
    #       the legacy mean only where the tensor holds one value per sample ([B]): a mean over a [B,T] tensor needs
    #       its tokens averaged first (masked mean over dim 1): the learner calls the loss per micro-batch and adds
    #       the results up. (`coati-relay docs custom-classes`)
    loss = -((advantages.squeeze(-1) * seq_log_probs).sum() / num_samples)
    return loss, {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="custom_trainer on coati_relay.launch_distributed")
    parser.add_argument("--prompt_path", type=str, required=True)
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "bloom", "opt", "llama"])
    parser.add_argument("--pretrain", type=str, default=None)
    parser.add_argument("--critic_pretrain", type=str, default=None)
    parser.add_argument("--experience_steps", type=int, default=4)
    parser.add_argument("--experience_batch_size", type=int, default=8)
    parser.add_argument("--train_epochs", type=int, default=1)
    parser.add_argument("--update_steps", type=int, default=2)
    parser.add_argument("--train_batch_size", type=int, default=8)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-05)
    parser.add_argument("--metrics_path", type=str, default="custom_trainer_metrics.jsonl")
    parser.add_argument("--save_dir", type=str, default=None)
    parser.add_argument("--num_episodes", type=int, default=1, help="passes over the prompt file (the run length)")
    parser.add_argument("--inference_backend", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--report_to", nargs="*", default=[], choices=["tensorboard", "wandb", "none"])
    parser.add_argument("--run_dir", default=None, help="metrics and checkpoints go here")
    return parser


def launch_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """The keywords of launch_distributed for these command-line arguments."""
    num_producers = 1
    num_consumers = 1
    inference_batch_size, inference_microbatch_size = round_sizes(
        num_producers, num_consumers, args.experience_batch_size, args.train_batch_size, args.update_steps)
    prompt_tokens = 32
    return dict(
        # NOTE: detached_trainer_name_list and experience_maker_holder_name_list have no counterpart: every consumer
        #       reads one shared rollout queue, so there are no actor names or routes to compute.
        #       (`coati-relay docs routing`)
        num_producers=num_producers,
        num_proc_per_producer=1,
        num_consumer_procs=num_consumers,
        # NOTE: each maker made workingloop(num_steps=args.experience_steps) batches; each trainer trained
        #       fit(total_steps=args.experience_batch_size * args.experience_steps // args.train_batch_size,
        #       update_steps=args.update_steps) batches; that is 4 batches per trainer, 32 samples in all (flags at
        #       their defaults). The engine's run length follows from the data: num_episodes * (prompts in the file
        #       // (inference_batch_size*num_producers)) rounds; set --num_episodes (and the file's size) to match.
        #       (legacy line 139) (`coati-relay docs run-length`)
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
        # NOTE: the legacy collate (in each maker) cut or padded each prompt to exactly prompt_tokens tokens; the
        #       engine samples the same CSV column (raw text, no chat template), pads per batch and keeps an
        #       over-long prompt's first prompt_tokens. (legacy line 131) (`coati-relay docs dataset`)
        train_dataset_config={"path": args.prompt_path, "max_length": prompt_tokens},
        # NOTE: model families (args.model) are no longer chosen: every model is a local Hugging Face checkpoint
        #       whose config.json sets the architecture. The reward model loads as a sequence classifier with one
        #       label, the critic as the checkpoint's trunk plus a value head. (`coati-relay docs models`)
        # NOTE: --critic_pretrain defaults to None, which legacy read as 'random weights of a default-size model';
        #       the engine needs a local checkpoint directory: pass --critic_pretrain. (`coati-relay docs models`)
        # NOTE: --pretrain defaults to None, which legacy read as 'random weights of a default-size model'; the
        #       engine needs a local checkpoint directory: pass --pretrain. (`coati-relay docs models`)
        # NOTE: the legacy script set tokenizer.pad_token at run time; the engine reads the tokenizer saved with the
        #       model and needs a pad token there (save one with save_pretrained). (`coati-relay docs models`)
        # NOTE: the maker's strategy_fn has no counterpart: producers generate with the inference backend
        #       (--inference_backend) and need no training strategy. (legacy line 102)
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
            "max_new_tokens": max_new_tokens(args.max_length, prompt_tokens), "top_k": 50, "temperature": 1.0,
            "top_p": 1.0},
        train_model_config={"path": args.pretrain},
        # NOTE: train_epochs -> grpo_config['ppo_epochs']: legacy replayed an episode's update_steps batches
        #       (shuffled) for train_epochs - 1 more epochs before pushing the weights; the engine passes over a
        #       round's batches ppo_epochs times, in order, before publishing a weight version. (legacy line 139)
        #       (`coati-relay docs train-epochs`)
        grpo_config={
            "lr": args.lr, "ppo_epochs": args.train_epochs, "beta": 0.0, "policy_loss": "DetachedPGTrainer",
            "lr_scheduler": "constant", "weight_decay": 0.0},
        plugin_config={"plugin": "ddp"},
        inference_backend=args.inference_backend,
        num_generations=2,
        # NOTE: DetachedPGTrainer.training_step is carried as the policy loss detached_pg_trainer_loss (above),
        #       registered in main() as 'DetachedPGTrainer' and named in grpo_config['policy_loss']. The learner
        #       calls it with the log-probs it computed; the legacy maker's advantage was reward - critic value,
        #       here RLOO's leave-one-out baseline over 2 responses per prompt stands in, so no critic is trained
        #       (train_batch_size counts prompts: each step sees 2 responses of each). The loss takes no KL term
        #       (beta 0, no reference model); the legacy maker folded kl_coef*KL into the reward: add beta *
        #       per_token_kl in the loss and set grpo_config['beta'] to keep one. The optimizer is Adam at a
        #       constant lr without weight decay, as the trainer's own was. (`coati-relay docs custom-classes`)
        core_algo="RLOO",
        project_name="custom_trainer",
        reward_model_config={"path": args.critic_pretrain},
        run_dir=args.run_dir,
        # NOTE: the legacy script saved its outputs in --save_dir; the engine's checkpoints go to
        #       save_dir/checkpoints/step-NNNNNN (under run_dir when None). (`coati-relay docs seed-and-save-dir`)
        save_dir=args.save_dir,
        report_to=args.report_to,
    )


def main(argv=None):
    from coati_relay import launch_distributed  # imported here: reading launch_kwargs stays cheap

    args = build_parser().parse_args(argv)
    from coati_relay.algorithms import register

    register("policy_loss", "DetachedPGTrainer")(detached_pg_trainer_loss)
    result = launch_distributed(**launch_kwargs(args), callbacks=[MetricsWriter(args.metrics_path)])
    print(result.summary)
    return result


if __name__ == "__main__":
    main()
