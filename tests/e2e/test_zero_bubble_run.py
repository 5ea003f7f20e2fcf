"""`launch_zero_bubble` end to end: Ray actors, producers running ahead within the buffer's bound."""
from __future__ import annotations

import pytest
from run_helpers import run_kwargs

pytestmark = pytest.mark.slow


def test_zero_bubble_trains_on_rollouts_at_most_the_bound_behind(ray_cluster, tiny_model_path, data, tmp_path):
    from coati_relay import launch_zero_bubble

    kw = run_kwargs(tiny_model_path, data, tmp_path / "run", backend="transformers", rounds=2, num_producers=1,
                    num_consumer_procs=1)
    result = launch_zero_bubble(**kw, data_actor_buffer_size_limit=8)  # 8 prompts = 2 versions of 4
    versions = [h["version"] for h in result.history]
    assert versions == list(range(1, len(versions) + 1)) and len(versions) == 4
    lags = [h["version"] - 1 - h["rollout_version_min"] for h in result.history]
    assert all(0 <= lag <= 2 for lag in lags), lags
    # how far ahead the producer gets depends on the host's load (seen: [0, 1, 2, 2]), so only the bound is asserted
    assert result.counters["consumed"] == result.counters["produced"]
