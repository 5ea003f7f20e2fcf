"""``weight_sync="collective"`` on CUDA: consumer rank 0 (training on its GPU) broadcasts every version to the
producer, which generates on its GPU with each one in lock-step."""
from __future__ import annotations

from gpu_lane import MARKS, needs_cluster_gpus, run_kwargs

pytestmark = MARKS


def test_collective_weight_sync_on_cuda(gpu_ray_cluster, tiny_model_path, data, tmp_path):
    from coati_relay import launch_distributed

    needs_cluster_gpus(gpu_ray_cluster, 2)
    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "coll", "GRPO", "transformers",
                                             num_episodes=2, weight_sync="collective"))
    assert [h["version"] for h in result.history] == [1, 2, 3, 4]
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "lock-step over broadcasts"
    assert all(h["weight_bytes"] > 0 for h in result.history)
