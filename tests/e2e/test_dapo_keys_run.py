"""A whole colocated DAPO run with the grpo_config ColossalChat's rl_example.py passes for DAPO (filter_range,
dynamic_batching, clip_eps_high 0.28, beta 0, token-level loss) on the toy reward: groups outside the range leave,
short steps carry over, it learns. The length keys stay off: the toy model rarely stops before max_new_tokens, so
filter_truncated_response would mask nearly every response and the length rule would zero its reward."""
from __future__ import annotations

import pytest
from run_helpers import rose, run_kwargs

pytestmark = pytest.mark.slow

DAPO = {"algo": "DAPO", "lr": 5e-3, "filter_range": [0.01, 0.99], "dynamic_batching": True, "clip_eps_low": 0.2,
        "clip_eps_high": 0.28, "skip_threshold": 20.0, "beta": 0, "loss_variation": "token_level",
        "reward_fn_type": "toy_letter"}


def test_dapo_keys_filter_carry_and_learn(tiny_model_path, data, tmp_path):
    from coati_relay import launch_distributed

    kw = run_kwargs(tiny_model_path, data, tmp_path, "DAPO", "transformers", rounds=12, num_producers=1,
                    num_consumer_procs=1, inference_batch_size=8, train_batch_size=4, grpo_config=DAPO,
                    colocate=True)
    result = launch_distributed(**kw)
    history = result.history
    assert len(history) == 12
    assert all(0.0 <= h["kept_group_fraction"] <= 1.0 for h in history)
    assert any(h["carried_groups"] > 0 for h in history) or any(h["kept_group_fraction"] < 1 for h in history)
    start, end = rose(history)
    assert end > start + 0.1, f"reward did not rise: {start:.3f} -> {end:.3f}"
