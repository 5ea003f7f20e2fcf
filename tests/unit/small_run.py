"""Keyword arguments of a small `launch_distributed` run on the toy task, for tests that only build or check its
config (nothing here starts an actor)."""
from __future__ import annotations

from typing import Any, Dict

from coati_relay.toy import write_toy_dataset


def small_run_kwargs(tmp_path, model: str, num_prompts: int = 8, **over: Any) -> Dict[str, Any]:
    """One producer and one consumer, 4 prompts x 2 samples a round of 4 new tokens, transformers backend, GRPO with
    the toy reward; ``over`` replaces or adds keywords."""
    data = write_toy_dataset(tmp_path / "toy.jsonl", num_prompts=num_prompts)
    kw = dict(num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
              inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
              train_dataset_config={"path": str(data), "max_length": 32, "system_prompt": ""},
              inference_model_config={"path": model},
              generate_config={"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0},
              train_model_config={"path": model},
              grpo_config={"lr": 1e-3, "reward_fn_type": "toy_letter"}, plugin_config={},
              inference_backend="transformers", num_generations=2, run_dir=str(tmp_path / "run"))
    kw.update(over)
    return kw
