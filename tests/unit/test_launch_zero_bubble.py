"""The zero-bubble entry's config (`coati_relay.launch_zero_bubble`): the data buffer's default and checks, the
staleness bound, the queue it sets up; and the queue's buffer in prompts (`RolloutQueueActor` without Ray)."""
from __future__ import annotations

import asyncio
import logging

import pytest
from small_run import small_run_kwargs

from coati_relay.assembly.build import ConfigError
from coati_relay.exchange.queue import RolloutQueueActor
from coati_relay.launch import queue_bounds
from coati_relay.launch_zero_bubble import buffer_limit, zero_bubble_config


def kwargs(tmp_path, model, **over):
    """1 producer, 2 consumers; micro-batches of 2 prompts, mini-batches of 2: default buffer 2 * 2 * 2 = 8."""
    return small_run_kwargs(tmp_path, model, num_prompts=16, **{
        **dict(num_consumer_procs=2, inference_microbatch_size=2, train_batch_size=2, train_minibatch_size=2),
        **over})


@pytest.mark.parametrize("given, expected", [(0, 8), (-5, 8), (1, 1), (3, 3), (24, 24)])
def test_the_buffer_defaults_to_twice_the_global_mini_batch(given, expected):
    assert buffer_limit(given, train_minibatch_size=2, num_consumer_procs=2) == expected


def test_the_config_carries_the_buffer_and_no_staleness_bound(tmp_path, tiny_model_path, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = zero_bubble_config(**kwargs(tmp_path, tiny_model_path))
    assert (cfg.roles.buffer_prompts, cfg.roles.n_behind, cfg.zero_bubble) == (8, None, True)
    assert cfg.version_needed(100) is None  # producers never wait for weights
    assert queue_bounds(cfg) == {"maxsize": 0, "staleness": None, "buffer_prompts": 8, "task_prompts": 2}
    assert "data_actor_buffer_size_limit" not in caplog.text
    cfg = zero_bubble_config(**kwargs(tmp_path, tiny_model_path, data_actor_buffer_size_limit=5))
    assert cfg.roles.buffer_prompts == 5


def test_n_behind_means_what_it_means_in_launch_distributed(tmp_path, tiny_model_path):
    from coati_relay.assembly.build import build_run_config

    kw = kwargs(tmp_path, tiny_model_path)
    cfg = zero_bubble_config(**kw, n_behind=1)
    lock_step = build_run_config(**kw, n_behind=1)
    assert cfg.roles.n_behind == 1 and cfg.roles.buffer_prompts == 8
    assert [cfg.version_needed(t) for t in range(6)] == [lock_step.version_needed(t) for t in range(6)]
    assert queue_bounds(cfg)["staleness"] == 1
    assert not lock_step.zero_bubble and queue_bounds(lock_step) == {"maxsize": 4, "staleness": 1}


@pytest.mark.parametrize("over, words", [
    ({"data_actor_buffer_size_limit": "8"}, ["data_actor_buffer_size_limit must be an int", "<= 0 for the default"]),
    ({"data_actor_buffer_size_limit": True}, ["data_actor_buffer_size_limit must be an int"]),
    ({"data_actor_buffer_size_limit": 2.5}, ["data_actor_buffer_size_limit must be an int", "2.5"]),
    ({"n_behind": -1}, ["n_behind must be None", "int >= 0"]),
    ({"n_behind": "1"}, ["n_behind must be None"]),
    ({"colocate": True}, ["colocate=True", "launch_distributed(colocate=True)"]),
    ({"data_actor_buffer_size_limit": "x", "num_producers": 0}, ["data_actor_buffer_size_limit must be an int",
                                                                  "num_producers"]),
    ({"num_producers": 0}, ["num_producers"]),
])
def test_bad_values_are_refused_naming_the_key(tmp_path, tiny_model_path, over, words):
    with pytest.raises(ConfigError) as err:
        zero_bubble_config(**kwargs(tmp_path, tiny_model_path, **over))
    assert all(w in str(err.value) for w in words), str(err.value)


def test_an_unknown_keyword_is_refused_as_in_launch_distributed(tmp_path, tiny_model_path):
    with pytest.raises(ConfigError, match="data_actor_buffer_size"):
        zero_bubble_config(**kwargs(tmp_path, tiny_model_path, data_actor_buffer_size=8))


def test_the_queue_lets_producers_claim_only_while_the_buffer_has_room():
    """ColossalChat's pick-up rule: a task is reserved while fewer than the limit's prompts are reserved or queued;
    prompts are released when a consumer takes them."""
    q = RolloutQueueActor(maxsize=0, staleness=None, total_tasks=10, buffer_prompts=5, task_prompts=2)
    assert [q.claim_task("p0") for _ in range(4)] == [0, 1, 2, -1]  # 0, 2, 4 prompts reserved: room; 6: none

    async def flow():
        await q.put(["r0"], version=0, size=2, producer="p0", task=0)  # claimed -> queued: still 6
        assert q.buffered_prompts() == 6 and q.claim_task("p0") == -1
        waiter = asyncio.ensure_future(q.wait_room(timeout_s=5))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        got = await q.get(1, timeout_s=5)  # a consumer takes 2 prompts: 4 left, room again
        await asyncio.wait_for(waiter, 5)
        return got

    assert [e.payload for e in asyncio.run(flow())] == [["r0"]]
    assert q.buffered_prompts() == 4 and q.claim_task("p0") == 3
    assert q.claim_task("p0", requeued_only=True) == -1  # orphans are not gated (none here)


def test_without_a_buffer_claims_are_not_gated():
    q = RolloutQueueActor(maxsize=0, staleness=0, total_tasks=3)
    assert [q.claim_task("p0") for _ in range(4)] == [0, 1, 2, -1]
    asyncio.run(q.wait_room(timeout_s=0.1))  # returns at once
