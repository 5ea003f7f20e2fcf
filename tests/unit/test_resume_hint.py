"""A `resume_from` that does not exist: the hint names the layout checkpoints really have (run_dir/checkpoints/
step-NNNNNN), and both forms it names are accepted."""
from __future__ import annotations

import re

import pytest

from coati_relay.checkpoint import save_checkpoint
from coati_relay.config import ConfigError, build_run_config
from coati_relay.toy import write_toy_dataset


def kwargs(tmp_path, model, **over):
    data = write_toy_dataset(tmp_path / "toy.jsonl", num_prompts=8)
    kw = dict(num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
              inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
              train_dataset_config={"path": str(data), "max_length": 32}, inference_model_config={"path": model},
              generate_config={"max_new_tokens": 4}, train_model_config={"path": model},
              grpo_config={"lr": 1e-3, "reward_fn_type": "toy_letter"}, plugin_config={},
              inference_backend="transformers", num_generations=2, run_dir=str(tmp_path / "run"))
    kw.update(over)
    return kw


def test_the_hint_names_where_checkpoints_are_written(tmp_path, tiny_model_path):
    with pytest.raises(ConfigError) as err:
        build_run_config(**kwargs(tmp_path, tiny_model_path, resume_from=str(tmp_path / "no-such-run")))
    hinted = re.search(r"pass a checkpoint directory \(run_dir/([\w/-]+)\)", str(err.value))
    assert hinted, str(err.value)
    run_dir = tmp_path / "old-run"
    written = save_checkpoint(run_dir, 7, {}, {"round": 1})
    assert written.relative_to(run_dir).as_posix() == hinted.group(1).replace("NNNNNN", "000007")
    for given in (written, run_dir):  # the two forms the hint offers
        cfg = build_run_config(**kwargs(tmp_path, tiny_model_path, resume_from=str(given)))
        assert cfg.checkpointing.resume_from == str(given)
