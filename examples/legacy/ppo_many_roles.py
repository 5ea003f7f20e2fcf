"""PPO from a CSV of prompts with several experience makers and several trainers, on the legacy ``coati.ray`` API.

Each maker holds an actor, a critic, a reward model and a frozen initial model; each trainer holds an actor and a
critic. Makers send experience to the trainers ``get_receivers_per_sender`` assigns them; trainers push their
weights back after every ``--update_steps`` batches. Models are built in fp16 and moved with ``.cuda()``, as a GPU
pipeline of the time did. With ``--save_dir`` every trainer saves its actor before and after training.

    RAY_NAMESPACE=ppo python ppo_many_roles.py --num_makers 2 --num_trainers 2 --model llama \
        --pretrain <model dir> --critic_pretrain <model dir> --prompt_path prompts.csv --save_dir ckpt
"""
import argparse
import os
import socket
from functools import partial

import pandas as pd
import ray
from coati.ray.detached_trainer_ppo import DetachedPPOTrainer
from coati.ray.experience_maker_holder import ExperienceMakerHolder
from coati.ray.utils import (
    get_actor_from_args,
    get_critic_from_args,
    get_receivers_per_sender,
    get_reward_model_from_args,
    get_strategy_from_args,
)
from torch.utils.data import DataLoader
from transformers import AutoTokenizer


def world_of(size):
    """One torch.distributed world on this host: a rendezvous port and the env_info (strings) of each rank."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    return [{"rank": str(rank), "local_rank": "0", "world_size": str(size), "master_addr": "127.0.0.1",
             "master_port": port} for rank in range(size)]


def frozen_models(args):
    """Runs inside a maker: actor, critic, reward model, initial model, all frozen and in fp16."""
    policy = get_actor_from_args(args.model, args.pretrain).requires_grad_(False).half().cuda()
    value = get_critic_from_args(args.critic_model, args.critic_pretrain).requires_grad_(False).half().cuda()
    scorer = get_reward_model_from_args(args.critic_model, args.critic_pretrain).requires_grad_(False).half().cuda()
    reference = get_actor_from_args(args.model, args.pretrain).requires_grad_(False).half().cuda()
    return policy, value, scorer, reference


def trainable_models(args):
    """Runs inside a trainer: the actor and the critic to train, in fp16."""
    policy = get_actor_from_args(args.model, args.pretrain, lora_rank=args.lora_rank).half().cuda()
    value = get_critic_from_args(args.critic_model, args.critic_pretrain, lora_rank=args.lora_rank).half().cuda()
    return policy, value


def prompt_batches(args):
    """Runs inside a maker: batches of left-padded prompt tokens read from the CSV's ``prompt`` column."""
    tokenizer = AutoTokenizer.from_pretrained(args.pretrain, padding_side="left")
    tokenizer.pad_token = tokenizer.eos_token

    def encode(texts):
        encoded = tokenizer(list(texts), max_length=args.prompt_tokens, padding="max_length", truncation=True,
                            return_tensors="pt")
        return {name: tensor.cuda() for name, tensor in encoded.items()}

    prompts = pd.read_csv(args.prompt_path)["prompt"]
    return DataLoader(prompts, batch_size=args.experience_batch_size, shuffle=True, collate_fn=encode)


def start_makers(args, tokenizer):
    worlds = world_of(args.num_makers)
    return [
        ExperienceMakerHolder.options(name=f"maker{i}", num_gpus=1, max_concurrency=2).remote(
            detached_trainer_name_list=[f"trainer{t}" for t in
                                        get_receivers_per_sender(i, args.num_makers, args.num_trainers, False)],
            strategy_fn=partial(get_strategy_from_args, args.maker_strategy),
            model_fn=partial(frozen_models, args),
            env_info=worlds[i],
            kl_coef=0.1,
            update_lora_weights=args.lora_rank > 0,
            eval_performance=True,
            debug=args.debug,
            max_length=args.max_length,
            do_sample=True,
            temperature=1.0,
            top_k=50,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            use_cache=True,
        )
        for i in range(args.num_makers)
    ]


def start_trainers(args):
    worlds = world_of(args.num_trainers)
    return [
        DetachedPPOTrainer.options(name=f"trainer{i}", num_gpus=1, max_concurrency=2).remote(
            experience_maker_holder_name_list=[f"maker{m}" for m in
                                               get_receivers_per_sender(i, args.num_trainers, args.num_makers, True)],
            strategy_fn=partial(get_strategy_from_args, args.trainer_strategy),
            model_fn=partial(trainable_models, args),
            env_info=worlds[i],
            train_batch_size=args.train_batch_size,
            buffer_limit=16,
            update_lora_weights=args.lora_rank > 0,
            eval_performance=True,
            debug=args.debug,
        )
        for i in range(args.num_trainers)
    ]


def save_actors(trainers, save_dir, tag):
    os.makedirs(save_dir, exist_ok=True)
    ray.get([t.strategy_save_actor.remote(os.path.join(save_dir, f"actor{i}_{tag}.pt")) for i, t in
             enumerate(trainers)])


def run(args):
    tokenizer = AutoTokenizer.from_pretrained(args.pretrain)
    tokenizer.pad_token = tokenizer.eos_token
    makers = start_makers(args, tokenizer)
    trainers = start_trainers(args)
    if args.save_dir:
        save_actors(trainers, args.save_dir, "start")
    produced = args.experience_batch_size * args.experience_steps * args.num_makers
    steps_per_trainer = produced // (args.num_trainers * args.train_batch_size)
    loops = [m.workingloop.remote(partial(prompt_batches, args), num_steps=args.experience_steps) for m in makers]
    fits = [t.fit.remote(steps_per_trainer, args.update_steps, args.train_epochs) for t in trainers]
    ray.get(loops + fits)
    if args.save_dir:
        save_actors(trainers, args.save_dir, "end")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt_path", required=True, help="CSV with a 'prompt' column")
    parser.add_argument("--num_makers", type=int, default=1)
    parser.add_argument("--num_trainers", type=int, default=1)
    parser.add_argument("--trainer_strategy", default="ddp",
                        choices=["naive", "ddp", "colossalai_gemini", "colossalai_zero2", "colossalai_gemini_cpu",
                                 "colossalai_zero2_cpu"])
    parser.add_argument("--maker_strategy", default="naive", choices=["naive"])
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "bloom", "opt", "llama"])
    parser.add_argument("--critic_model", default="gpt2", choices=["gpt2", "bloom", "opt", "llama"])
    parser.add_argument("--pretrain", required=True, help="actor checkpoint (also the tokenizer)")
    parser.add_argument("--critic_pretrain", required=True, help="critic and reward-model checkpoint")
    parser.add_argument("--experience_steps", type=int, default=4, help="batches each maker makes")
    parser.add_argument("--experience_batch_size", type=int, default=8, help="prompts per maker batch")
    parser.add_argument("--train_batch_size", type=int, default=8, help="samples per trainer step")
    parser.add_argument("--update_steps", type=int, default=2, help="trainer steps between weight pushes")
    parser.add_argument("--train_epochs", type=int, default=1)
    parser.add_argument("--prompt_tokens", type=int, default=64, help="prompts are padded/truncated to this")
    parser.add_argument("--max_length", type=int, default=256, help="prompt plus response tokens")
    parser.add_argument("--lora_rank", type=int, default=0)
    parser.add_argument("--save_dir", default=None, help="where trainers save their actor before and after")
    parser.add_argument("--debug", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    options = parse_args()
    ray.init(namespace=os.environ["RAY_NAMESPACE"], runtime_env={"env_vars": dict(os.environ)})
    run(options)
