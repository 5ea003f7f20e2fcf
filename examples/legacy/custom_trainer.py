"""A user-defined trainer on the legacy ``coati.ray`` API: a subclass of ``DetachedTrainer`` made a Ray actor with
the legacy concurrency groups, implementing ``training_step`` and ``_update_remote_makers``.

The trainer runs a plain policy-gradient step (``-A * mean log-prob`` of the actions, no critic) and pushes the
actor's weights to its makers with the chunked ``update_experience_maker`` protocol. A callback writes each step's
metrics to ``--metrics_path``; with ``--save_dir`` the actor's weights are saved before and after training
(``actor0_start.pt``, ``actor0_end.pt``). Run with ``RAY_NAMESPACE`` set, e.g.::

    RAY_NAMESPACE=admin python custom_trainer.py --model llama --pretrain <model dir> \
        --critic_pretrain <model dir> --prompt_path prompts.csv --metrics_path metrics.jsonl
"""
import argparse
import json
import os
from functools import partial

import pandas as pd
import ray
import torch
from coati.models.utils import masked_mean
from coati.ray.callbacks import TrainerCallback
from coati.ray.detached_trainer_base import DetachedTrainer
from coati.ray.experience_maker_holder import ExperienceMakerHolder
from coati.ray.utils import (
    get_actor_from_args,
    get_critic_from_args,
    get_reward_model_from_args,
    get_strategy_from_args,
    state_dict_to,
)
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

TIMEOUT_S = 600


class MetricsWriter(TrainerCallback):
    """Appends one JSON line per training step to ``path``."""

    def __init__(self, path):
        self.path = path
        self.step = 0

    def on_batch_end(self, metrics, experience):
        self.step += 1
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": self.step, **metrics}) + "\n")


@ray.remote(
    concurrency_groups={"buffer_length": 1, "buffer_append": 1, "buffer_sample": 1, "model_io": 1, "compute": 1}
)
class DetachedPGTrainer(DetachedTrainer):
    def __init__(self, experience_maker_holder_name_list, model_fn, lr=1e-5, train_batch_size=8, buffer_limit=0,
                 callbacks=None, debug=False):
        self.actor = model_fn()
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=lr)
        super().__init__(experience_maker_holder_name_list, train_batch_size=train_batch_size,
                         buffer_limit=buffer_limit, callbacks=callbacks or [], debug=debug)

    @ray.method(concurrency_group="compute")
    def training_step(self, experience):
        self.actor.train()
        num_actions = experience.action_mask.size(1)
        log_probs = self.actor(experience.sequences, num_actions, attention_mask=experience.attention_mask)
        seq_log_probs = masked_mean(log_probs, experience.action_mask, dim=1)
        loss = -(experience.advantages.squeeze(-1) * seq_log_probs).mean()
        loss.backward()
        self.actor_optim.step()
        self.actor_optim.zero_grad()
        return {"pg_loss": loss.item(), "reward": experience.reward.mean().item()}

    @ray.method(concurrency_group="model_io")
    def save_actor(self, path):
        torch.save(state_dict_to(self.actor.model.state_dict()), path)

    @ray.method(concurrency_group="model_io")
    @torch.no_grad()
    def _update_remote_makers(self, fully_update=False, **config):
        self.update_target_holder_list()
        makers = self.target_holder_list
        state_dict = state_dict_to(self.actor.model.state_dict())
        ray.get([m.update_experience_maker.remote(chunk_start=True, fully_update=fully_update) for m in makers],
                timeout=TIMEOUT_S)
        ray.get([m.update_experience_maker.remote(new_actor_state_dict=state_dict, fully_update=fully_update)
                 for m in makers], timeout=TIMEOUT_S)
        ray.get([m.update_experience_maker.remote(chunk_end=True, fully_update=fully_update) for m in makers],
                timeout=TIMEOUT_S)


def main(args):
    tokenizer = AutoTokenizer.from_pretrained(args.pretrain)
    tokenizer.pad_token = tokenizer.eos_token

    def maker_model_fn():
        actor = get_actor_from_args(args.model, args.pretrain).requires_grad_(False).half().cuda()
        critic = get_critic_from_args(args.model, args.critic_pretrain).requires_grad_(False).half().cuda()
        reward_model = get_reward_model_from_args(args.model, args.critic_pretrain).requires_grad_(False).half().cuda()
        initial_model = get_actor_from_args(args.model, args.pretrain).requires_grad_(False).half().cuda()
        return actor, critic, reward_model, initial_model

    maker = ExperienceMakerHolder.options(name="maker0", num_gpus=1, max_concurrency=2).remote(
        detached_trainer_name_list=["trainer0"],
        strategy_fn=partial(get_strategy_from_args, "naive"),
        model_fn=maker_model_fn,
        kl_coef=0.1,
        max_length=args.max_length,
        do_sample=True,
        top_k=50,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )

    def trainer_model_fn():
        return get_actor_from_args(args.model, args.pretrain).cuda()

    trainer = DetachedPGTrainer.options(name="trainer0", num_gpus=1, max_concurrency=2).remote(
        experience_maker_holder_name_list=["maker0"],
        model_fn=trainer_model_fn,
        lr=args.lr,
        train_batch_size=args.train_batch_size,
        buffer_limit=4,
        callbacks=[MetricsWriter(args.metrics_path)],
    )

    def build_dataloader():
        def tokenize_fn(texts):
            batch = tokenizer(texts, return_tensors="pt", max_length=32, padding="max_length", truncation=True)
            return {k: v.cuda() for k, v in batch.items()}

        dataset = pd.read_csv(args.prompt_path)["prompt"]
        return DataLoader(dataset=dataset, batch_size=args.experience_batch_size, shuffle=True, collate_fn=tokenize_fn)

    if args.save_dir:
        os.makedirs(args.save_dir, exist_ok=True)
        ray.get(trainer.save_actor.remote(os.path.join(args.save_dir, "actor0_start.pt")), timeout=TIMEOUT_S)
    total_steps = args.experience_batch_size * args.experience_steps // args.train_batch_size
    ray.get([maker.workingloop.remote(build_dataloader, num_steps=args.experience_steps),
             trainer.fit.remote(total_steps, args.update_steps, args.train_epochs)], timeout=TIMEOUT_S)
    if args.save_dir:
        ray.get(trainer.save_actor.remote(os.path.join(args.save_dir, "actor0_end.pt")), timeout=TIMEOUT_S)
    with open(args.metrics_path) as f:
        steps = [json.loads(line) for line in f]
    print(f"custom trainer: {len(steps)} steps, last pg_loss {steps[-1]['pg_loss']:.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
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
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--metrics_path", type=str, default="custom_trainer_metrics.jsonl")
    parser.add_argument("--save_dir", type=str, default=None)
    args = parser.parse_args()

    ray.init(namespace=os.environ["RAY_NAMESPACE"], runtime_env={"env_vars": dict(os.environ)})
    main(args)
