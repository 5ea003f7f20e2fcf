"""Whole runs of the engine on the toy task: 2 producers, 2 consumers, real Ray actors, vLLM and Booster."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from coati_relay.toy import write_toy_dataset

pytestmark = pytest.mark.slow


def run_kwargs(model, data, run_dir, algo="GRPO", backend="vllm", rounds=12, **over):
    group = 4
    kw = dict(
        num_producers=2, num_proc_per_producer=1, num_consumer_procs=2, num_episodes=rounds,
        inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
        train_dataset_config={"path": str(data), "max_length": 32},
        inference_model_config={"path": model}, train_model_config={"path": model},
        generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 0},
        grpo_config={"lr": 5e-3, "critic_lr": 5e-3, "beta": 0.0, "kl_coef": 0.0, "reward_fn_type": "toy_letter"},
        plugin_config={"plugin": "ddp"}, inference_backend=backend, num_generations=group, core_algo=algo,
        run_dir=str(run_dir), save_interval=1000, progress=False, timeout_s=120,
    )
    kw.update(over)
    return kw


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_toy_dataset(tmp_path_factory.mktemp("e2e") / "toy.jsonl", num_prompts=8)


def _rose(history, key="reward"):
    r = [h[key] for h in history]
    k = max(2, len(r) // 4)
    start, end = sum(r[:k]) / k, sum(r[-k:]) / k
    return start, end


@pytest.mark.parametrize("algo,backend", [("GRPO", "vllm"), ("PPO", "transformers")])
def test_reward_rises(ray_cluster, tiny_model_path, data, tmp_path, algo, backend):
    from coati_relay import launch_distributed

    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / algo, algo, backend))
    assert len(result.history) == 12
    assert [h["version"] for h in result.history] == list(range(1, 13))
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "lock-step (n_behind=0)"
    start, end = _rose(result.history)
    assert end > start + 0.1, f"{algo}: reward did not rise: {start:.3f} -> {end:.3f}"
    c = result.counters
    assert c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"]
    assert c["consumed"] == 12 * 2 and c["dropped"] == 0
    lines = (tmp_path / algo / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 12 and "reward" in json.loads(lines[0])
    assert result.checkpoints and result.checkpoints[-1].endswith("step-000012")


def test_lora_only_sync_with_vllm(ray_cluster, tiny_model_path, data, tmp_path):
    from coati_relay import launch_distributed

    lora = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    result = launch_distributed(**run_kwargs(
        tiny_model_path, data, tmp_path / "lora", backend="vllm", rounds=2, num_producers=1,
        num_consumer_procs=1, train_model_config={"path": tiny_model_path, "lora": lora}))
    assert [h["version"] for h in result.history] == [1, 2, 3, 4]
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history)
    full_bytes = sum(p.stat().st_size for p in Path(tiny_model_path).glob("*.safetensors"))
    assert 0 < result.history[0]["weight_bytes"] < full_bytes / 4, "only the adapters travel"


def test_checkpoint_then_resume_loses_no_step(ray_cluster, tiny_model_path, data, tmp_path):
    from coati_relay import launch_distributed
    from coati_relay.checkpoint import list_checkpoints

    first = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "a", backend="transformers",
                                            rounds=4, save_interval=2))
    assert [p.name for p in list_checkpoints(tmp_path / "a")] == ["step-000002", "step-000004"]
    ckpt = str(list_checkpoints(tmp_path / "a")[0])
    resumed = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "b", backend="transformers",
                                              rounds=4, save_interval=2, resume_from=ckpt))
    assert [h["step"] for h in resumed.history] == [3, 4], "resume continues at the step after the checkpoint"
    assert resumed.history[0]["rollout_version_min"] == 2, "producers start from the checkpoint's weights"
    assert resumed.counters["consumed"] == 2 * 2
    assert first.history[-1]["step"] == resumed.history[-1]["step"]


class ProducerKiller(threading.Thread):
    """Kills the run's producer-0 once ``after_steps`` training steps are in the run's metrics file."""

    def __init__(self, ray, run_dir, after_steps: int = 2):
        super().__init__(daemon=True)
        self.ray, self.metrics, self.after_steps = ray, run_dir / "metrics.jsonl", after_steps
        self.killed_at = None

    def run(self):
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.metrics.exists() and len(self.metrics.read_text().splitlines()) >= self.after_steps:
                for a in self.ray.util.list_named_actors(all_namespaces=True):
                    if a["name"].endswith("/producer-0"):
                        self.ray.kill(self.ray.get_actor(a["name"], namespace=a["namespace"]), no_restart=True)
                        self.killed_at = time.monotonic()
                        return
            time.sleep(0.2)


def test_killed_producer_ends_the_run_naming_it(ray_cluster, tiny_model_path, data, tmp_path):
    from coati_relay import launch_distributed
    from coati_relay.launch import RunFailed

    killer = ProducerKiller(ray_cluster, tmp_path / "fail")
    killer.start()
    with pytest.raises(RunFailed, match="producer-0") as err:
        launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "fail", backend="transformers",
                                        rounds=30))
    assert killer.killed_at is not None
    assert time.monotonic() - killer.killed_at < 30
    c = err.value.counters
    assert c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"]


def test_killed_producer_work_moves_to_the_others(ray_cluster, tiny_model_path, data, tmp_path):
    from coati_relay import launch_distributed

    killer = ProducerKiller(ray_cluster, tmp_path / "cont")
    killer.start()
    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "cont", backend="transformers",
                                             rounds=8, on_producer_failure="continue"))
    assert killer.killed_at is not None
    assert len(result.history) == 8
    c = result.counters
    assert c["dead_producers"] == ["producer-0"]
    assert c["consumed"] == 8 * 2 and c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"]


def test_collective_weight_sync(ray_cluster, tiny_model_path, data, tmp_path):
    """The second WeightSync: consumer rank 0 broadcasts each version over gloo to both producers."""
    from coati_relay import launch_distributed

    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "coll", backend="transformers",
                                             rounds=4, weight_sync="collective"))
    assert [h["version"] for h in result.history] == [1, 2, 3, 4]
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "lock-step over broadcasts"
    assert result.history[0]["weight_bytes"] > 0
    start, end = _rose(result.history)
    assert end > start, "training still moves the reward with broadcast weights"
