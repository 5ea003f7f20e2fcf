"""The batch, role and episode keywords mean ColossalChat's sizes (launch.py:launch_distributed, producer.py,
consumer.py and grpo_consumer.py at 4f9953be3): the numbers its launcher derives are the config's."""
from __future__ import annotations

import pytest

from coati_relay.assembly.build import ConfigError, build_run_config
from tests.unit.small_run import small_run_kwargs


def test_sizes_are_the_ones_colossalchats_launcher_derives(tiny_model_path, tmp_path):
    kw = small_run_kwargs(tmp_path, tiny_model_path, num_prompts=21, num_producers=2, num_consumer_procs=2,
                          num_episodes=3, inference_batch_size=4, inference_microbatch_size=2, train_batch_size=2,
                          train_minibatch_size=1)
    cfg = build_run_config(**kw)
    # launch.py: num_update_per_episode = 21 // (4 * 2); num_recv_per_update = 4 // 2 from each producer
    assert cfg.prompts_per_round == 8 and cfg.rounds_per_episode == 21 // 8
    assert cfg.total_rounds == 3 * 2, "num_episodes passes over the prompts, the remainder left out (drop_last)"
    assert cfg.tasks_per_round == 2 * (4 // 2)
    # grpo_consumer.py: an optimizer step per train_batch_size * dp effective prompts; dp = num_consumer_procs here
    assert cfg.roles.num_consumers == 2 and cfg.optimizer_steps_per_round == 8 // (2 * 2)
    # grpo_consumer.py:step: train_microbatch_size defaults to the mini-batch's rows (prompts x generations)
    assert cfg.batches.train_microbatch_size == 1 * 2
    assert cfg.roles.n_behind == 0, "launch_distributed's default: lock-step"
    explicit = build_run_config(**{**kw, "grpo_config": {**kw["grpo_config"], "train_microbatch_size": 1}})
    assert explicit.batches.train_microbatch_size == 1


@pytest.mark.parametrize("over, words", [
    # ColossalChat runs both (its asserts hold); this engine's queue entries are whole inference micro-batches
    (dict(inference_batch_size=6, inference_microbatch_size=3, train_batch_size=2, train_minibatch_size=2),
     "must divide one another"),
    (dict(num_consumer_procs=2, inference_batch_size=2, inference_microbatch_size=2, train_batch_size=1,
          train_minibatch_size=1), "split evenly"),
])
def test_sizes_colossalchat_accepts_that_this_engine_refuses(tiny_model_path, tmp_path, over, words):
    kw = small_run_kwargs(tmp_path, tiny_model_path, num_prompts=12, **over)
    dp = kw["num_consumer_procs"]  # launch.py's three asserts hold for these sizes
    assert (kw["inference_batch_size"] * kw["num_producers"]) % (kw["train_batch_size"] * dp) == 0
    assert kw["inference_batch_size"] % kw["inference_microbatch_size"] == 0
    assert kw["train_batch_size"] % kw["train_minibatch_size"] == 0
    with pytest.raises(ConfigError, match=words):
        build_run_config(**kw)
