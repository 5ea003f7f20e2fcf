"""Short whole runs on CUDA: GRPO with a vLLM producer and PPO (with its critic) with a transformers producer, both
training with LowLevelZero and HybridAdam; the trained weights are finite and have moved."""
from __future__ import annotations

import pytest
from gpu_lane import MARKS, changed_fraction, needs_cluster_gpus, non_finite, run_kwargs, trained_weights

pytestmark = MARKS


@pytest.mark.parametrize("algo,backend", [("GRPO", "vllm"), ("PPO", "transformers")])
def test_short_run_trains_on_cuda(gpu_ray_cluster, tiny_model_path, data, tmp_path, algo, backend):
    from coati_relay import launch_distributed
    from coati_relay.training.booster_backend import load_causal_lm

    needs_cluster_gpus(gpu_ray_cluster, 2)
    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / algo, algo, backend))
    assert [h["version"] for h in result.history] == [1, 2]
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "lock-step (n_behind=0)"
    assert result.checkpoints, "the run ends with a checkpoint"
    policy = trained_weights(result.checkpoints[-1])
    assert not non_finite(policy), non_finite(policy)
    assert changed_fraction(load_causal_lm(tiny_model_path).state_dict(), policy) > 0.5, "training moved the policy"
    if algo == "PPO":
        critic = trained_weights(result.checkpoints[-1], "critic")
        assert critic and not non_finite(critic), non_finite(critic)
