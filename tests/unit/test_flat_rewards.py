"""``frac_reward_zero_std``: the learner counts the groups whose rewards are all equal in each round's metrics, the
progress line shows it, and the driver warns once when no group has reward variance for several rounds in a row."""
from __future__ import annotations

import io
import logging

import pytest
from train_round_helpers import BigramLM, make_config, make_rollout

from coati_relay.observe.flat_rewards import ROUNDS, FlatRewardWatch
from coati_relay.observe.metrics import ProgressBar
from coati_relay.roles.consumer import ConsumerWorker

WARNING = "no group has reward variance"


@pytest.mark.parametrize("dynamic_batching", [False, True])
def test_the_round_metrics_count_groups_with_equal_rewards(tiny_model_path, tmp_path, dynamic_batching):
    from coati_relay.toy import write_toy_dataset

    data = str(write_toy_dataset(tmp_path / "p.jsonl", num_prompts=16))
    cfg = make_config(tiny_model_path, data, core_algo="DAPO", train_batch_size=2, dynamic_batching=dynamic_batching)
    rollout = make_rollout([[3, 4], [6], [7, 8]], [[1], [2], [3], [4], [5], [6]], 2, [0.0, 0.0, 1.0, 0.0, 1.0, 1.0],
                           policy=BigramLM())
    stats = ConsumerWorker.for_models(cfg, BigramLM()).train_round(rollout)
    assert stats["frac_reward_zero_std"] == pytest.approx(2 / 3)


def _warnings(caplog) -> list:
    return [r for r in caplog.records if WARNING in r.getMessage()]


def test_one_warning_after_several_flat_rounds_in_a_row(caplog):
    watch = FlatRewardWatch(group_size=4, needs_critic=False)
    flat, mixed = {"frac_reward_zero_std": 1.0, "reward": 0.0}, {"frac_reward_zero_std": 0.5, "reward": 0.2}
    with caplog.at_level(logging.WARNING):
        for step, metrics in enumerate([flat] * (ROUNDS - 1) + [mixed] + [flat] * (ROUNDS - 1), start=1):
            watch.update(step, metrics)
        assert not _warnings(caplog), "a round with variance starts the count again"
        for step in range(2 * ROUNDS, 4 * ROUNDS):
            watch.update(step, flat)
    [warned] = _warnings(caplog)
    assert warned.getMessage() == (f"steps {ROUNDS + 1}-{2 * ROUNDS}: no group has reward variance (every response to "
                                   f"a prompt scored the same; mean reward 0): the loss is 0 and nothing learns; "
                                   f"check the reward function against your data")


@pytest.mark.parametrize("group_size, needs_critic", [(1, False), (4, True)])
def test_no_warning_where_equal_rewards_still_train(caplog, group_size, needs_critic):
    watch = FlatRewardWatch(group_size=group_size, needs_critic=needs_critic)
    with caplog.at_level(logging.WARNING):
        for step in range(1, 3 * ROUNDS):
            watch.update(step, {"frac_reward_zero_std": 1.0})
    assert not _warnings(caplog)


def test_the_progress_line_shows_it():
    out = io.StringIO()
    ProgressBar(2, desc="grpo", file=out).update(0, {"reward": 0.5, "frac_reward_zero_std": 0.25})
    assert out.getvalue().startswith("grpo: step 1/2 reward=0.500 zero_std=0.250 ")


def _constant(responses, gt_answers, prompts):
    return [0.1] * len(responses)


@pytest.mark.slow
def test_a_run_with_a_constant_reward_logs_it_and_warns_once(tmp_path, tiny_model_path, caplog):
    from small_run import small_run_kwargs

    from coati_relay import launch_distributed

    kw = small_run_kwargs(tmp_path, tiny_model_path, num_episodes=2, colocate=True, progress=False,
                          export_dir=False, grpo_config={"lr": 1e-3, "reward_fn": _constant})
    kw.pop("inference_model_config")
    with caplog.at_level(logging.WARNING):
        result = launch_distributed(**kw)
    assert [r["frac_reward_zero_std"] for r in result.history] == [1.0] * 4
    assert len(_warnings(caplog)) == 1
