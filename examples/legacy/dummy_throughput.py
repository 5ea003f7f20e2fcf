"""Throughput of the legacy ``coati.ray`` roles on random prompts and randomly initialised models.

Nothing is read but a model config: makers and trainers build random weights of that shape (cheaply, under
``low_resource_init`` and ``no_init_weights``), the makers wait for the trainers' first full weight push, and each
maker samples from random token prompts. The performance evaluators print samples/s and the time splits of both
roles. With ``--save_dir`` every trainer saves its actor before and after training.

    RAY_NAMESPACE=bench python dummy_throughput.py --num_makers 2 --num_trainers 1 --model opt --pretrain <config dir>
"""
import argparse
import os
import socket
from functools import partial

import ray
import torch
from coati.quant import low_resource_init
from coati.ray.detached_trainer_ppo import DetachedPPOTrainer
from coati.ray.experience_maker_holder import ExperienceMakerHolder
from coati.ray.utils import (
    get_actor_from_args,
    get_critic_from_args,
    get_receivers_per_sender,
    get_reward_model_from_args,
    get_strategy_from_args,
)
from transformers import AutoConfig, AutoTokenizer
from transformers.modeling_utils import no_init_weights


def world_of(size):
    """One torch.distributed world on this host: the env_info (strings) of each of its ranks."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    return [{"rank": str(rank), "local_rank": "0", "world_size": str(size), "master_addr": "127.0.0.1",
             "master_port": port} for rank in range(size)]


def maker_models(args):
    """Runs inside a maker: four models of the config's shape; actor and critic weights come with the trainers'
    first push."""
    with low_resource_init(), no_init_weights():  # overwritten by the first push: skip their initialisation
        policy = get_actor_from_args(args.model, config=AutoConfig.from_pretrained(args.pretrain))
        value = get_critic_from_args(args.model, config=AutoConfig.from_pretrained(args.pretrain))
    # never pushed: these need real (random) weights
    scorer = get_reward_model_from_args(args.model, config=AutoConfig.from_pretrained(args.pretrain))
    reference = get_actor_from_args(args.model, config=AutoConfig.from_pretrained(args.pretrain))
    return tuple(model.requires_grad_(False).half().cuda() for model in (policy, value, scorer, reference))


def trainer_models(args):
    """Runs inside a trainer: a randomly initialised actor and critic of the config's shape."""
    policy = get_actor_from_args(args.model, config=AutoConfig.from_pretrained(args.pretrain)).half().cuda()
    value = get_critic_from_args(args.model, config=AutoConfig.from_pretrained(args.pretrain)).half().cuda()
    return policy, value


def random_prompts(args, vocab_size):
    """Runs inside a maker: an endless supply of batches of random prompt tokens."""
    def batches():
        while True:
            ids = torch.randint(vocab_size, (args.experience_batch_size, args.prompt_tokens),
                                device=torch.cuda.current_device())
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    return batches()


def run(args):
    tokenizer = AutoTokenizer.from_pretrained(args.pretrain)
    maker_worlds, trainer_worlds = world_of(args.num_makers), world_of(args.num_trainers)
    makers = [
        ExperienceMakerHolder.options(name=f"maker{i}", num_gpus=1, max_concurrency=2).remote(
            detached_trainer_name_list=[f"trainer{t}" for t in
                                        get_receivers_per_sender(i, args.num_makers, args.num_trainers, False)],
            strategy_fn=partial(get_strategy_from_args, args.maker_strategy),
            model_fn=partial(maker_models, args),
            env_info=maker_worlds[i],
            sync_models_from_trainers=True,
            kl_coef=0.1,
            eval_performance=True,
            max_length=args.max_length,
            do_sample=True,
            temperature=1.0,
            top_k=50,
            pad_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        for i in range(args.num_makers)
    ]
    trainers = [
        DetachedPPOTrainer.options(name=f"trainer{i}", num_gpus=1, max_concurrency=2).remote(
            experience_maker_holder_name_list=[f"maker{m}" for m in
                                               get_receivers_per_sender(i, args.num_trainers, args.num_makers, True)],
            strategy_fn=partial(get_strategy_from_args, args.trainer_strategy),
            model_fn=partial(trainer_models, args),
            env_info=trainer_worlds[i],
            train_batch_size=args.train_batch_size,
            buffer_limit=16,
            eval_performance=True,
        )
        for i in range(args.num_trainers)
    ]
    if args.save_dir:
        os.makedirs(args.save_dir, exist_ok=True)
        ray.get([t.strategy_save_actor.remote(os.path.join(args.save_dir, f"actor{i}_start.pt"))
                 for i, t in enumerate(trainers)])
    ray.get([t.sync_models_to_remote_makers.remote() for t in trainers])  # the makers start from these weights
    vocab_size = AutoConfig.from_pretrained(args.pretrain).vocab_size
    total_steps = args.experience_batch_size * args.experience_steps * args.num_makers // (
        args.num_trainers * args.train_batch_size)
    ray.get([m.workingloop.remote(partial(random_prompts, args, vocab_size), num_steps=args.experience_steps)
             for m in makers] + [t.fit.remote(total_steps, args.update_steps, args.train_epochs) for t in trainers])
    if args.save_dir:
        ray.get([t.strategy_save_actor.remote(os.path.join(args.save_dir, f"actor{i}_end.pt"))
                 for i, t in enumerate(trainers)])


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_makers", type=int, default=1)
    parser.add_argument("--num_trainers", type=int, default=1)
    parser.add_argument("--trainer_strategy", default="ddp",
                        choices=["naive", "ddp", "colossalai_gemini", "colossalai_zero2", "colossalai_gemini_cpu",
                                 "colossalai_zero2_cpu"])
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
    return parser.parse_args()


if __name__ == "__main__":
    options = parse_args()
    ray.init(namespace=os.environ["RAY_NAMESPACE"], runtime_env={"env_vars": dict(os.environ)})
    run(options)
