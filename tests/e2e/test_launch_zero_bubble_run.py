"""The zero-bubble entry end to end (`coati_relay.launch_zero_bubble.launch_distributed`): real Ray actors, one
transformers producer and one consumer; the producer runs ahead within the data buffer while the consumer trains,
and loads newer weights between its inference batches without waiting for them."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import run_kwargs

pytestmark = pytest.mark.slow

ROUNDS_PER_EPISODE, EPISODES, TASKS_PER_ROUND = 2, 3, 2  # 8 prompts, rounds of 4, micro-batches of 2


def test_producer_runs_ahead_picks_up_weights_mid_episode_and_trains(ray_cluster, tiny_model_path, data, tmp_path):
    from transformers import AutoModelForCausalLM

    from coati_relay.launch_zero_bubble import launch_distributed

    kw = run_kwargs(tiny_model_path, data, tmp_path / "run", backend="transformers", rounds=EPISODES,
                    num_producers=1, num_consumer_procs=1, inference_microbatch_size=2, train_minibatch_size=2)
    result = launch_distributed(**kw)  # buffer: the default, 2 * train_minibatch_size * 1 = 4 prompts = 2 tasks
    rounds = ROUNDS_PER_EPISODE * EPISODES
    assert [h["version"] for h in result.history] == list(range(1, rounds + 1))
    assert result.counters["consumed"] == result.counters["produced"] == rounds * TASKS_PER_ROUND
    assert result.counters["dropped"] == 0, "no staleness bound: nothing is thrown away"

    # ran ahead: every round after the first was generated before the previous round's weights existed
    lags = [h["version"] - 1 - h["rollout_version_min"] for h in result.history]
    assert lags[0] == 0 and all(lag >= 1 for lag in lags[1:]), lags
    stats, = result.producer_stats
    log = stats["task_log"]  # (task, weight version, start, end)
    assert [t for t, *_ in log] == list(range(rounds * TASKS_PER_ROUND))
    trained = [(h["step"] - 1, h["train_started_at"], h["train_ended_at"]) for h in result.history]
    overlapped = [(task, r) for task, _, start, end in log for r, t0, t1 in trained
                  if task // TASKS_PER_ROUND > r and start < t1 and end > t0]
    assert overlapped, f"no task of a later round was generated while a round trained: {log} {trained}"

    # weights: never waited for, picked up between inference batches, within episodes
    assert stats["wait_s"] == 0.0
    versions = [v for _, v, *_ in log]
    assert versions == sorted(versions) and versions[-1] >= 2, versions
    per_task = ROUNDS_PER_EPISODE * TASKS_PER_ROUND
    episodes = [versions[e * per_task:(e + 1) * per_task] for e in range(EPISODES)]
    assert any(len(set(ep)) > 1 for ep in episodes), f"no episode saw a new version: {episodes}"
    assert all(len(set(versions[i:i + TASKS_PER_ROUND])) == 1 for i in range(0, len(versions), TASKS_PER_ROUND)), \
        f"a version changed inside an inference batch: {versions}"
    assert stats["weight_loads"] >= len(set(versions))  # the first version at set-up, each newer one picked up
    assert stats["room_wait_s"] > 0.0, "the producer never waited for room: the buffer did not bound it"
    assert all(h["wait_s"] >= 0.0 for h in result.history)

    # trained weights: finite, and moved from the initial ones
    assert result.checkpoints and result.checkpoints[-1].endswith(f"step-{rounds:06d}")
    after = torch.load(Path(result.checkpoints[-1]) / "policy" / "model.pt", map_location="cpu")
    before = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    assert all(bool(torch.isfinite(t).all()) for t in after.values())
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) > len(before) // 2, f"only {len(moved)} of {len(before)} tensors moved"
