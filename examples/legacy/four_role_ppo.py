"""PPO with four groups of GPU-era Ray workers: policy, value, reference and reward.

Each group is ``--workers_per_role`` workers (``@ray.remote(num_gpus=1)``) on a placement group of
``{"GPU": 1, "CPU": 1}`` bundles, joined in one torch.distributed world per group. An iteration:

1. every policy worker samples a batch of prompts and returns ``(sequences, attention_mask, action_mask)``;
2. the value, reference and reward groups and the policy group score those batches from their object references,
   all in parallel (Ray hands a task its arguments once they exist);
3. the policy workers assemble ``Experience`` items from the five references (KL-shaped reward, advantage
   ``reward - value``);
4. the policy group (each worker its share) and the value group (every item) take PPO steps on those items
   (``PolicyLoss``, ``ValueLoss``), again handed over as references.

The reward group loads ``--rm_path``, the state dict of a trained ``RewardModel`` (what a reward-model training
run saved with ``strategy.save_model``), on the ``--reward_pretrain`` base; without it, it scores with a random head.
At the end, rank 0 of the policy group saves the actor's state dict to ``--save_dir/actor.pt``. Every wait has a
timeout (``--timeout_s``). On a host without GPUs run it in CPU mode::

    coati-relay legacy-run four_role_ppo.py --pretrain <gpt2 dir> --prompt_csv prompts.csv --save_dir ckpt
"""
import argparse
import os
import socket

import pandas as pd
import ray
import torch
from coati.experience_maker.base import Experience
from coati.models.base import RewardModel
from coati.models.gpt import GPTActor, GPTCritic
from coati.models.loss import PolicyLoss, ValueLoss
from coati.models.opt import OPTActor, OPTCritic
from coati.models.utils import compute_reward
from coati.trainer.strategies import DDPStrategy, GeminiStrategy, LowLevelZeroStrategy
from colossalai.nn.optimizer import HybridAdam
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from torch.optim import Adam
from transformers import AutoTokenizer

FAMILIES = {"gpt2": (GPTActor, GPTCritic), "opt": (OPTActor, OPTCritic)}


def build_strategy(name):
    if name == "ddp":
        return DDPStrategy()
    if name == "colossalai_zero2":
        return LowLevelZeroStrategy(stage=2, placement_policy="cuda")
    if name == "colossalai_gemini":
        return GeminiStrategy(placement_policy="cuda", initial_scale=2**5)
    raise ValueError(f"unknown strategy {name!r}: use ddp, colossalai_zero2 or colossalai_gemini")


class GroupMember:
    """One rank of a group's torch.distributed world; the strategy reads the world from the environment."""

    def __init__(self, rank, world_size, master_addr, master_port):
        os.environ.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world_size), MASTER_ADDR=master_addr,
                          MASTER_PORT=str(master_port))
        self.rank = rank

    def setup(self, strategy_name, args):
        self.args = args
        self.strategy = build_strategy(strategy_name)
        with self.strategy.model_init_context():
            self.model = self.build_model(args).to(torch.cuda.current_device())
        if self.trains:
            optim_cls = HybridAdam if isinstance(self.strategy, (LowLevelZeroStrategy, GeminiStrategy)) else Adam
            self.optimizer = optim_cls(self.model.parameters(), lr=args.lr)
            self.model, self.optimizer = self.strategy.prepare((self.model, self.optimizer))
        else:
            self.model = self.strategy.prepare(self.model)
        self.model.eval()
        return self.rank

    def learn(self, *experiences):
        """One optimizer step on each experience item (Ray resolves the references); returns the losses."""
        self.model.train()
        losses = []
        for exp in experiences:
            exp.to_device(torch.cuda.current_device())
            loss = self.loss(exp)
            self.strategy.backward(loss, self.model, self.optimizer)
            self.strategy.optimizer_step(self.optimizer)
            self.optimizer.zero_grad()
            losses.append(loss.item())
        self.model.eval()
        return losses


@ray.remote(num_gpus=1)
class PolicyWorker(GroupMember):
    trains = True

    def build_model(self, args):
        actor_cls = FAMILIES[args.model][0]
        return actor_cls(pretrained=args.pretrain, lora_rank=args.lora_rank)

    def load_prompts(self, csv_path):
        self.tokenizer = AutoTokenizer.from_pretrained(self.args.pretrain)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.sampler = self.strategy.setup_sampler(list(pd.read_csv(csv_path)["prompt"]))
        self.loss_fn = PolicyLoss(self.args.clip_eps)

    @torch.no_grad()
    def sample(self, batch_size):
        prompts = self.sampler.sample(batch_size)
        inputs = self.tokenizer(prompts, return_tensors="pt", padding=True, truncation=True,
                                max_length=self.args.prompt_tokens)
        inputs = {k: v.cuda() for k, v in inputs.items()}
        sequences, attention_mask, action_mask = self.model.generate(
            inputs["input_ids"], attention_mask=inputs["attention_mask"], return_action_mask=True,
            max_length=inputs["input_ids"].size(1) + self.args.new_tokens, do_sample=True, top_k=50,
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id)
        return sequences.cpu(), attention_mask.cpu(), action_mask.cpu()

    @torch.no_grad()
    def log_probs(self, batch):
        sequences, attention_mask, action_mask = (t.cuda() for t in batch)
        return self.model(sequences, action_mask.size(1), attention_mask).cpu()

    def assemble(self, batch, log_probs, ref_log_probs, values, rewards):
        sequences, attention_mask, action_mask = batch
        reward = compute_reward(rewards, self.args.kl_coef, log_probs, ref_log_probs, action_mask=action_mask)
        advantages = (reward - values).unsqueeze(-1)
        return Experience(sequences, log_probs, values, reward, advantages, attention_mask, action_mask)

    def loss(self, exp):
        log_probs = self.model(exp.sequences, exp.action_mask.size(1), attention_mask=exp.attention_mask)
        return self.loss_fn(log_probs, exp.action_log_probs, exp.advantages, action_mask=exp.action_mask)

    def save(self, path):
        if self.rank == 0:
            self.strategy.save_model(self.model, path, only_rank0=True)
        return path


@ray.remote(num_gpus=1)
class ValueWorker(GroupMember):
    trains = True

    def build_model(self, args):
        self.loss_fn = ValueLoss(args.value_clip)
        return FAMILIES[args.model][1](pretrained=args.pretrain, lora_rank=args.lora_rank)

    @torch.no_grad()
    def values(self, batch):
        sequences, attention_mask, action_mask = (t.cuda() for t in batch)
        return self.model(sequences, action_mask, attention_mask).cpu()

    def loss(self, exp):
        values = self.model(exp.sequences, action_mask=exp.action_mask, attention_mask=exp.attention_mask)
        return self.loss_fn(values, exp.values, exp.reward, action_mask=exp.action_mask)


@ray.remote(num_gpus=1)
class ReferenceWorker(GroupMember):
    trains = False

    def build_model(self, args):
        return FAMILIES[args.model][0](pretrained=args.pretrain)

    @torch.no_grad()
    def log_probs(self, batch):
        sequences, attention_mask, action_mask = (t.cuda() for t in batch)
        return self.model(sequences, action_mask.size(1), attention_mask).cpu()


@ray.remote(num_gpus=1)
class RewardWorker(GroupMember):
    trains = False

    def build_model(self, args):
        critic = FAMILIES[args.model][1](pretrained=args.reward_pretrain or args.pretrain)
        reward_model = RewardModel(critic.model, critic.value_head)
        if args.rm_path:  # a trained reward model: the state dict its training script saved
            reward_model.load_state_dict(torch.load(args.rm_path, map_location="cpu"))
        else:
            torch.manual_seed(args.seed + 1)  # a head of its own: the value head starts elsewhere
            torch.nn.init.normal_(critic.value_head.weight, std=0.5)
        return reward_model

    @torch.no_grad()
    def rewards(self, batch):
        sequences, attention_mask, _ = (t.cuda() for t in batch)
        return self.model(sequences, attention_mask).cpu()


def free_port():
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class Group:
    """``size`` workers of ``cls`` on a placement group of one ``{"GPU": 1, "CPU": 1}`` bundle each."""

    def __init__(self, cls, size, timeout_s):
        self.pg = placement_group([{"GPU": 1, "CPU": 1}] * size, strategy="PACK")
        ray.get(self.pg.ready(), timeout=timeout_s)
        master = (ray.util.get_node_ip_address(), free_port())
        self.workers = [
            cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=rank)).remote(rank, size, *master)
            for rank in range(size)]

    def call(self, method, *args):
        return [getattr(w, method).remote(*args) for w in self.workers]

    def round_robin(self, method, items):
        return [getattr(self.workers[i % len(self.workers)], method).remote(item) for i, item in enumerate(items)]


def main(args):
    timeout = args.timeout_s
    groups = {name: Group(cls, args.workers_per_role, timeout) for name, cls in
              (("policy", PolicyWorker), ("value", ValueWorker), ("reference", ReferenceWorker),
               ("reward", RewardWorker))}
    policy, value = groups["policy"], groups["value"]
    try:
        ray.get([ref for g in groups.values() for ref in g.call("setup", args.strategy, args)], timeout=timeout)
        ray.get(policy.call("load_prompts", args.prompt_csv), timeout=timeout)
        for step in range(args.steps):
            batches = policy.call("sample", args.batch_size)
            log_probs = policy.round_robin("log_probs", batches)
            ref_log_probs = groups["reference"].round_robin("log_probs", batches)
            values = value.round_robin("values", batches)
            rewards = groups["reward"].round_robin("rewards", batches)
            experiences = [policy.workers[i % len(policy.workers)].assemble.remote(*parts)
                           for i, parts in enumerate(zip(batches, log_probs, ref_log_probs, values, rewards))]
            mean_reward = torch.cat(ray.get(rewards, timeout=timeout)).mean().item()
            per_worker = [experiences[i::len(policy.workers)] for i in range(len(policy.workers))]
            actor_losses = ray.get([w.learn.remote(*refs) for w, refs in zip(policy.workers, per_worker)],
                                   timeout=timeout)
            critic_losses = ray.get([w.learn.remote(*experiences) for w in value.workers], timeout=timeout)
            print(f"step {step + 1}: reward {mean_reward:.4f} actor loss {actor_losses[0][0]:.4f} "
                  f"critic loss {critic_losses[0][0]:.4f}", flush=True)
        os.makedirs(args.save_dir, exist_ok=True)
        saved = ray.get(policy.call("save", os.path.join(args.save_dir, "actor.pt")), timeout=timeout)
        print(f"saved {saved[0]}")
    finally:
        for group in groups.values():
            for worker in group.workers:
                ray.kill(worker)
            remove_placement_group(group.pg)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--kl_coef", type=float, default=0.1)
    parser.add_argument("--clip_eps", type=float, default=0.2)
    parser.add_argument("--value_clip", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--save_dir", default="four_role_ckpt")
    parser.add_argument("--timeout_s", type=float, default=600)
    args = parser.parse_args()
    ray.init()
    main(args)
