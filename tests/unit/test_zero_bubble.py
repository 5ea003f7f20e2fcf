"""`launch_zero_bubble`: ColossalChat's zero-bubble keywords; its prompt buffer becomes the queue's staleness bound."""
from __future__ import annotations

import logging

import pytest
from small_run import small_run_kwargs

from coati_relay.config.build import ConfigError
from coati_relay.zero_bubble import versions_ahead, zero_bubble_config


def kwargs(tmp_path, model, **over):
    """2 producers x 4 prompts: 8 prompts per weight version; default buffer 2 * 2 * 2 = 8 prompts."""
    return small_run_kwargs(tmp_path, model, num_prompts=16, **{
        **dict(num_producers=2, num_consumer_procs=2, inference_microbatch_size=2, train_batch_size=2,
               train_minibatch_size=2), **over})


@pytest.mark.parametrize("limit, expected", [(0, 1), (-5, 1), (1, 1), (8, 1), (9, 2), (24, 3)])
def test_the_buffer_in_prompts_becomes_versions_ahead(limit, expected):
    assert versions_ahead(limit, inference_batch_size=4, num_producers=2, train_minibatch_size=2,
                          num_consumer_procs=2) == expected


def test_the_default_buffer_follows_colossalchat(tmp_path):
    # <= 0: 2 * train_minibatch_size * dp = 2 * 8 * 2 = 32 prompts, 4 versions of 8 prompts
    assert versions_ahead(0, inference_batch_size=4, num_producers=2, train_minibatch_size=8,
                          num_consumer_procs=2) == 4


def test_the_config_carries_the_bound_and_does_not_warn(tmp_path, tiny_model_path, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = zero_bubble_config(**kwargs(tmp_path, tiny_model_path, data_actor_buffer_size_limit=24))
    assert cfg.roles.n_behind == 3
    assert "data_actor_buffer_size_limit" not in caplog.text
    assert zero_bubble_config(**kwargs(tmp_path, tiny_model_path)).roles.n_behind == 1


@pytest.mark.parametrize("over, words", [
    ({"n_behind": 2}, ["no keyword 'n_behind'", "data_actor_buffer_size_limit"]),
    ({"colocate": True}, ["launch_distributed(colocate=True)"]),
    ({"data_actor_buffer_size_limit": "8"}, ["data_actor_buffer_size_limit must be an int"]),
    ({"num_producers": 0}, ["num_producers"]),
])
def test_what_zero_bubble_refuses(tmp_path, tiny_model_path, over, words):
    with pytest.raises(ConfigError) as err:
        zero_bubble_config(**kwargs(tmp_path, tiny_model_path, **over))
    assert all(w in str(err.value) for w in words), str(err.value)
