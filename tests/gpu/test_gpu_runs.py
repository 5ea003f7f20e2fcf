"""Whole runs on CUDA: GRPO with a vLLM producer and PPO (with its critic) with a transformers producer, disaggregated
on Ray, and GRPO colocated with transformers and with vLLM (which sleeps while the policy trains), all training with
LowLevelZero; the reward rises and the trained weights are finite. And an actor placed without a GPU sees none."""
from __future__ import annotations

import pytest
from gpu_lane import (
    MARKS,
    changed_fraction,
    needs_cluster_gpus,
    needs_vllm,
    non_finite,
    rose,
    run_kwargs,
    trained_weights,
)

pytestmark = MARKS

ROUNDS = 12  # 2 rounds an episode: long enough for the toy reward to rise (as on CPU, tests/e2e)
LEARNING = {"lr": 5e-3, "critic_lr": 5e-3, "beta": 0.0, "kl_coef": 0.0, "reward_fn_type": "toy_letter"}


def _check_learned(result, tiny_model_path, what: str) -> None:
    from coati_relay.training.booster_backend import load_causal_lm

    assert [h["version"] for h in result.history] == list(range(1, ROUNDS + 1))
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "lock-step (n_behind=0)"
    start, end = rose(result.history)
    assert end > start + 0.1, f"{what}: the reward did not rise: {start:.3f} -> {end:.3f}"
    policy = trained_weights(result.checkpoints[-1])
    assert not non_finite(policy), non_finite(policy)
    assert changed_fraction(load_causal_lm(tiny_model_path).state_dict(), policy) > 0.5, "training moved the policy"


@pytest.mark.parametrize("algo,backend", [("GRPO", "vllm"), ("PPO", "transformers")])
def test_short_run_learns_on_cuda(gpu_ray_cluster, tiny_model_path, data, tmp_path, algo, backend):
    from coati_relay import launch_distributed

    if backend == "vllm":
        needs_vllm()
    needs_cluster_gpus(gpu_ray_cluster, 2)
    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / algo, algo, backend,
                                             num_episodes=ROUNDS // 2, grpo_config=LEARNING))
    _check_learned(result, tiny_model_path, f"{algo} with {backend}")
    if algo == "PPO":
        critic = trained_weights(result.checkpoints[-1], "critic")
        assert critic and not non_finite(critic), non_finite(critic)


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_colocated_run_learns_on_cuda(tiny_model_path, data, tmp_path, backend):
    """One process: transformers generates with the training model in place; vLLM holds its own copy, started on
    what the trainer left of the GPU, asleep while the policy trains."""
    from coati_relay import launch_distributed

    if backend == "vllm":
        needs_vllm()
        engine = {"enforce_eager": True}
    else:
        engine = {}
    kw = run_kwargs(tiny_model_path, data, tmp_path / backend, "GRPO", backend, num_episodes=ROUNDS // 2,
                    grpo_config=LEARNING, colocate=True, inference_batch_size=4, train_batch_size=4)
    kw["inference_model_config"] = {"path": tiny_model_path, **engine}
    result = launch_distributed(**kw)
    _check_learned(result, tiny_model_path, f"colocated {backend}")
    if backend == "vllm":
        assert all(h["weight_sync_s"] > 0 for h in result.history), "each trained version loads into the engine"


def test_an_actor_placed_without_a_gpu_sees_none_on_a_gpu_host(gpu_ray_cluster):
    """Fewer GPUs than roles places every role on CPU; Ray leaves such an actor the node's CUDA_VISIBLE_DEVICES,
    so the placement hides the GPUs itself."""
    from ray.util.placement_group import remove_placement_group

    from coati_relay.cluster.placement import RoleRequest, actor_options, reserve

    @gpu_ray_cluster.remote
    class Probe:
        def cuda(self):
            import torch

            return torch.cuda.is_available()

    request = RoleRequest("consumer-0", {"CPU": 0.5})
    pg = reserve([request], "PACK", timeout_s=60)
    try:
        probe = Probe.options(**actor_options(pg, 0, request)).remote()
        assert gpu_ray_cluster.get(probe.cuda.remote(), timeout=120) is False
        gpu_ray_cluster.kill(probe)
    finally:
        remove_placement_group(pg)
