"""The oracle itself (coati_compat.reference) against numbers stated in legacy_spec §A.2-§A.5."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from coati_compat.reference.orchestration import (
    fit_events,
    route_items,
    weight_push_calls,
    workingloop_batches,
    workingloop_events,
)
from coati_compat.reference.replay_buffer import BufferEmpty, LegacyReplayBufferModel


@pytest.mark.parametrize("total,update,epochs", [(4, 2, 1), (5, 2, 3), (1, 2, 1), (6, 3, 2)])
def test_fit_events_counts_and_order(total, update, epochs):
    events = fit_events(total, update, epochs)
    counts = Counter(name for name, _ in events)
    episodes = total // update
    assert counts["buffer_sample"] == episodes * update
    assert counts["training_step"] == counts["on_batch_end"] == episodes * update * epochs
    assert counts["update_remote_makers"] == counts["on_episode_end"] == episodes
    assert events[0] == ("on_fit_start", None) and events[-1] == ("on_fit_end", None)
    if episodes:
        last_step = max(i for i, (n, _) in enumerate(events) if n == "training_step")
        push = max(i for i, (n, _) in enumerate(events) if n == "update_remote_makers")
        assert last_step < push  # the push comes after every epoch of the episode
        assert [a for n, a in events if n == "on_epoch_start"][:epochs] == list(range(epochs))


def test_workingloop():
    assert workingloop_batches(10, num_epochs=3) == 30
    assert workingloop_batches(10, num_epochs=3, num_steps=4) == 4
    events = workingloop_events(2)
    assert events[0][0] == "on_loop_start" and events[-1][0] == "on_loop_end"
    assert [n for n, _ in events].count("send_items") == 2


def test_route_items_is_per_item_round_robin_across_calls():
    routes, nxt = route_items([3, 2], num_trainers=2)
    assert routes == [[0, 1, 0], [1, 0]] and nxt == 1


def test_weight_push_calls_order():
    calls = weight_push_calls(False, num_actor_shards=2, num_critic_shards=1)
    assert calls[0] == {"chunk_start": True, "fully_update": False}
    assert [("new_actor_state_dict" in c, "new_critic_state_dict" in c) for c in calls[1:4]] == [
        (True, False), (True, False), (False, True)]
    assert calls[-1] == {"chunk_end": True, "fully_update": False}


def test_replay_buffer_model_batching_limit_and_leftovers():
    buffer = LegacyReplayBufferModel(sample_batch_size=3, limit=1)
    buffer.extend(list(range(7)))
    assert buffer.get_length() == 1 and buffer.producer_blocked and buffer.collector == [6]
    assert buffer.sample() == [0, 1, 2]
    assert buffer.get_length() == 1 and not buffer.producer_blocked
    assert buffer.sample() == [3, 4, 5]
    with pytest.raises(BufferEmpty):
        buffer.sample()
    assert buffer.collector == [6]  # the partial batch is never flushed
    with pytest.raises(AttributeError, match="tp_world_size"):
        buffer.clear()
    assert buffer.get_length() == 0


def test_reference_training_step_updates_both_models():
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

    from coati_compat.reference.training import ppo_training_step

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=32, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    actor, body, head = GPT2LMHeadModel(cfg), GPT2Model(cfg), torch.nn.Linear(16, 1)
    batch = {"sequences": torch.randint(0, 32, (2, 8)), "action_log_probs": -torch.rand(2, 3),
             "values": torch.randn(2), "reward": torch.randn(2), "advantages": torch.randn(2, 1),
             "attention_mask": torch.ones(2, 8, dtype=torch.long), "action_mask": torch.ones(2, 3, dtype=torch.bool)}
    before = (actor.lm_head.weight.clone(), head.weight.clone())
    out = ppo_training_step(actor, body, head, torch.optim.SGD(actor.parameters(), lr=0.1),
                            torch.optim.SGD([*body.parameters(), *head.parameters()], lr=0.1), batch)
    assert set(out) == {"actor_loss", "critic_loss"} and out["critic_loss"] > 0
    assert not torch.equal(before[0], actor.lm_head.weight) and not torch.equal(before[1], head.weight)
