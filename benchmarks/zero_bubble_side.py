"""One side of the zero-bubble pair (`test_zero_bubble_overlap.py`), run as its own process with a Ray cluster of its
own sized to this host's cores (``ray.init(num_cpus=os.cpu_count())``, what a plain ``ray.init()`` gives a user
here): the roles' torch threads then match the cores, as they would on the user's machine.

    python benchmarks/zero_bubble_side.py {lock-step|zero-bubble} --model DIR --prompts FILE --steps N --out RESULT.json

The work: one transformers producer and one consumer, ``PROMPTS`` prompts x ``GROUP`` samples of at most
``NEW_TOKENS`` new tokens per step in micro-batches of half the prompts, GRPO on the toy reward. The result file holds
the run's three figures, from the engine's own timings (`figures`), and the run's counters.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from typing import Any, Dict

PROMPTS, GROUP, NEW_TOKENS = 8, 8, 16


def launch_kwargs(model: str, prompts: str, steps: int, run_dir: str) -> Dict[str, Any]:
    return dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=steps,
        inference_batch_size=PROMPTS, inference_microbatch_size=PROMPTS // 2, train_batch_size=PROMPTS,
        train_minibatch_size=PROMPTS // 2, num_generations=GROUP,
        train_dataset_config={"path": prompts, "max_length": 32},
        inference_model_config={"path": model}, train_model_config={"path": model},
        generate_config={"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "top_p": 1.0},
        grpo_config={"lr": 5e-3, "beta": 0.0, "reward_fn_type": "toy_letter"}, plugin_config={"plugin": "ddp"},
        inference_backend="transformers", core_algo="GRPO", run_dir=run_dir, save_interval=10 ** 6,
        progress=False, timeout_s=300, project_name="zero-bubble-bench")


def figures(result, steps: int) -> Dict[str, float]:
    """The run's figures, from its history (the consumer's ``wait_s`` and ``round_s`` of each step after the first)
    and its producer's counters (``wait_s`` for weights, ``room_wait_s`` for room in the queue, ``claim_idle_s``
    with nothing to claim); checks the work was done."""
    assert [h["step"] for h in result.history] == list(range(1, steps + 1))
    assert result.counters["consumed"] == result.counters["produced"] == 2 * steps
    assert all(math.isfinite(h["loss"]) for h in result.history)
    stats, = result.producer_stats
    later = result.history[1:]
    return {"producer_idle_s_per_step": (stats["wait_s"] + stats["room_wait_s"] + stats["claim_idle_s"]) / steps,
            "producer_weight_wait_s_per_step": stats["wait_s"] / steps,
            "producer_room_wait_s_per_step": stats["room_wait_s"] / steps,
            "trainer_idle_s_per_step": statistics.median(h["wait_s"] for h in later),
            "s_per_step": statistics.median(h["round_s"] for h in later),
            "train_s_per_step": statistics.median(h["train_s"] for h in later),
            "max_versions_behind": max(h["version"] - 1 - h["rollout_version_min"] for h in result.history),
            "samples": sum(h["samples"] for h in result.history)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("entry", choices=["lock-step", "zero-bubble"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import ray

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    kwargs = launch_kwargs(args.model, args.prompts, args.steps, args.out + ".run")
    if args.entry == "zero-bubble":
        from coati_relay.launch_zero_bubble import launch_distributed

        result = launch_distributed(**kwargs)  # the default buffer: 2 * train_minibatch_size * 1 = one step's prompts
    else:
        from coati_relay.launch import launch_distributed

        result = launch_distributed(**kwargs, n_behind=0)
    with open(args.out, "w") as f:
        json.dump({**figures(result, args.steps), "counters": result.counters}, f)
    ray.shutdown()


if __name__ == "__main__":
    main()
