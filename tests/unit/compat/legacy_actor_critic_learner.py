"""A third user-defined legacy trainer (a test fixture for the rewriter, never run on the legacy side): a
``DetachedTrainer`` subclass that trains an actor and a critic in its own ``training_step``: a ratio-weighted
policy-gradient loss for the actor, a Huber loss of the critic's values against the rewards for the critic, each
with its own optimizer."""
import argparse

import pandas as pd
import ray
import torch
from coati.models.utils import masked_mean
from coati.ray.detached_trainer_base import DetachedTrainer
from coati.ray.experience_maker_holder import ExperienceMakerHolder
from coati.ray.utils import get_actor_from_args, get_critic_from_args, get_reward_model_from_args
from torch.utils.data import DataLoader
from transformers import AutoTokenizer


@ray.remote
class HuberActorCritic(DetachedTrainer):
    def __init__(self, experience_maker_holder_name_list, actor_fn, critic_fn, lr=2e-5):
        self.actor, self.critic = actor_fn(), critic_fn()
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=lr)
        self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=lr)
        super().__init__(experience_maker_holder_name_list, train_batch_size=4)

    def training_step(self, experience):
        num_actions = experience.action_mask.size(1)
        log_probs = self.actor(experience.sequences, num_actions, attention_mask=experience.attention_mask)
        ratio = masked_mean((log_probs - experience.action_log_probs).exp(), experience.action_mask, dim=1)
        adv = masked_mean(experience.advantages, experience.action_mask, dim=1)
        actor_loss = -(ratio * adv).mean()
        actor_loss.backward()
        self.actor_optim.step()
        self.actor_optim.zero_grad()
        values = self.critic(experience.sequences, action_mask=experience.action_mask,
                             attention_mask=experience.attention_mask)
        err = values - experience.reward
        huber = torch.where(err.abs() < 1.0, 0.5 * err ** 2, err.abs() - 0.5)
        critic_loss = 0.5 * huber.mean() + 0.1 * ((values - experience.values) ** 2).mean()
        critic_loss.backward()
        self.critic_optim.step()
        self.critic_optim.zero_grad()
        return {"actor_loss": actor_loss.item(), "critic_loss": critic_loss.item(),
                "reward": experience.reward.mean().item()}


def main(args):
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)

    def prompts():
        def tokenize(texts):
            return tokenizer(texts, return_tensors="pt", max_length=24, padding="max_length", truncation=True)

        return DataLoader(pd.read_csv(args.prompt_path)["prompt"], batch_size=4, collate_fn=tokenize)

    def maker_models():
        actor = get_actor_from_args("llama", args.model_path)
        critic = get_critic_from_args("llama", args.model_path)
        reward_model = get_reward_model_from_args("llama", args.model_path)
        return actor, critic, reward_model, get_actor_from_args("llama", args.model_path)

    maker = ExperienceMakerHolder.options(name="m0").remote(detached_trainer_name_list=["t0"], model_fn=maker_models,
                                                            kl_coef=0.0, max_length=40)
    learner = HuberActorCritic.options(name="t0").remote(
        experience_maker_holder_name_list=["m0"], actor_fn=lambda: get_actor_from_args("llama", args.model_path),
        critic_fn=lambda: get_critic_from_args("llama", args.model_path), lr=args.lr)
    ray.get([maker.workingloop.remote(prompts, num_steps=4), learner.fit.remote(4, 2, 1)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_path", required=True)
    parser.add_argument("--prompt_path", default="prompts.csv")
    parser.add_argument("--lr", type=float, default=2e-5)
    main(parser.parse_args())
