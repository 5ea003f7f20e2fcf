"""A dataset whose size is not a multiple of a round's prompts: the driver says once how many prompts each episode
leaves out."""
from __future__ import annotations

import logging

from train_round_helpers import make_config

MESSAGE = "each episode trains on"


def _build(tiny_model_path, tmp_path, num_prompts, caplog):
    from coati_relay.toy import write_toy_dataset

    data = str(write_toy_dataset(tmp_path / f"p{num_prompts}.jsonl", num_prompts=num_prompts))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="coati_relay.assembly.build"):
        cfg = make_config(tiny_model_path, data)
    return cfg, [r.getMessage() for r in caplog.records if MESSAGE in r.getMessage()]


def test_prompts_left_out_of_each_episode_are_named_once(tiny_model_path, tmp_path, caplog):
    cfg, said = _build(tiny_model_path, tmp_path, 30, caplog)
    assert cfg.rounds_per_episode == 3
    assert said == ["the dataset has 30 prompts and a round takes 8 (inference_batch_size*num_producers): each "
                    "episode trains on 24 of them and leaves 6 out (which ones changes with each episode's shuffle); "
                    "add or drop prompts, or change the batch sizes, to use every one"]


def test_nothing_is_said_when_every_prompt_is_used(tiny_model_path, tmp_path, caplog):
    _, said = _build(tiny_model_path, tmp_path, 32, caplog)
    assert said == []
