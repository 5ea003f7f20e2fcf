"""A second user-defined legacy trainer (a test fixture for the rewriter, never run on the legacy side): a
``DetachedTrainer`` subclass whose ``training_step`` takes clipped advantages and a small penalty on the sequence
log-probs, through the legacy strategy's ``backward``, and a ``TrainerCallback`` that logs each step."""
import argparse
import json

import pandas as pd
import ray
import torch
from coati.models.utils import masked_mean
from coati.ray.callbacks import TrainerCallback
from coati.ray.detached_trainer_base import DetachedTrainer
from coati.ray.experience_maker_holder import ExperienceMakerHolder
from coati.ray.utils import get_actor_from_args, get_reward_model_from_args, get_strategy_from_args
from torch.utils.data import DataLoader
from transformers import AutoTokenizer


class JsonlLog(TrainerCallback):
    def __init__(self, log_file):
        self.log_file = log_file

    def on_fit_start(self):
        open(self.log_file, "w").close()

    def on_episode_end(self, episode):
        print("episode", episode)

    def on_batch_end(self, stats, exp):
        with open(self.log_file, "a") as f:
            f.write(json.dumps(stats) + "\n")


@ray.remote
class ReinforceLearner(DetachedTrainer):
    def __init__(self, experience_maker_holder_name_list, model_fn, lr=2e-5, callbacks=None):
        self.strategy = get_strategy_from_args("naive")
        self.model = model_fn()
        self.optim = torch.optim.Adam(self.model.parameters(), lr=lr)
        super().__init__(experience_maker_holder_name_list, train_batch_size=4, callbacks=callbacks or [])

    def training_step(self, exp):
        n = exp.action_mask.size(1)
        logp = self.model(exp.sequences, n, attention_mask=exp.attention_mask)
        seq_logp = masked_mean(logp, exp.action_mask, dim=1)
        adv = exp.advantages.squeeze(-1).clamp(-2.0, 2.0)
        loss = -(adv * seq_logp).mean() + 0.01 * (seq_logp ** 2).mean()
        self.strategy.backward(loss, self.model, self.optim)
        self.strategy.optimizer_step(self.optim)
        self.optim.zero_grad()
        return {"loss_value": loss.item(), "mean_reward": exp.reward.mean().item(), "adv": adv.mean().item()}


def main(args):
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)

    def prompts():
        def tokenize(texts):
            return tokenizer(texts, return_tensors="pt", max_length=24, padding="max_length", truncation=True)

        return DataLoader(pd.read_csv(args.prompt_path)["prompt"], batch_size=4, collate_fn=tokenize)

    def maker_models():
        actor = get_actor_from_args("llama", args.model_path)
        reward_model = get_reward_model_from_args("llama", args.model_path)
        return actor, None, reward_model, get_actor_from_args("llama", args.model_path)

    maker = ExperienceMakerHolder.options(name="m0").remote(detached_trainer_name_list=["t0"], model_fn=maker_models,
                                                            kl_coef=0.0, max_length=40)
    learner = ReinforceLearner.options(name="t0").remote(
        experience_maker_holder_name_list=["m0"], model_fn=lambda: get_actor_from_args("llama", args.model_path),
        lr=args.lr, callbacks=[JsonlLog(args.log_file)])
    ray.get([maker.workingloop.remote(prompts, num_steps=4), learner.fit.remote(4, 2, 1)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_path", required=True)
    parser.add_argument("--prompt_path", default="prompts.csv")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--log_file", default="learner_log.jsonl")
    main(parser.parse_args())
