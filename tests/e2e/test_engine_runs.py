"""Whole runs of the engine on the toy task: 2 producers, 2 consumers, real Ray actors, vLLM and Booster."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import AfterSteps, kill_actor, rose, run_kwargs

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("algo,backend", [("GRPO", "vllm"), ("PPO", "transformers")])
def test_reward_rises(ray_cluster, tiny_model_path, data, tmp_path, algo, backend):
    from coati_relay import launch_distributed

    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / algo, algo, backend))
    assert len(result.history) == 12
    assert [h["version"] for h in result.history] == list(range(1, 13))
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "lock-step (n_behind=0)"
    start, end = rose(result.history)
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
    # one-round episodes: ColossalChat's cadence saves at each episode's end
    assert [p.name for p in list_checkpoints(tmp_path / "a")] == [f"step-00000{i}" for i in (1, 2, 3, 4)]
    ckpt = str(list_checkpoints(tmp_path / "a")[1])
    resumed = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "b", backend="transformers",
                                              rounds=4, save_interval=2, resume_from=ckpt))
    assert [h["step"] for h in resumed.history] == [3, 4], "resume continues at the step after the checkpoint"
    assert resumed.history[0]["rollout_version_min"] == 2, "producers start from the checkpoint's weights"
    assert resumed.counters["consumed"] == 2 * 2
    assert first.history[-1]["step"] == resumed.history[-1]["step"]


@pytest.mark.timed
def test_killed_producer_ends_the_run_naming_it(ray_cluster, tiny_model_path, data, tmp_path, record_property):
    from coati_relay import launch_distributed
    from coati_relay.observe.run_result import RunFailed

    killer = AfterSteps(tmp_path / "fail", 2, kill_actor(ray_cluster, "producer-0"))
    killer.start()
    with pytest.raises(RunFailed, match="producer-0") as err:
        launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "fail", backend="transformers",
                                        rounds=30))
    assert killer.seconds_since_fired() < 30
    record_property("fault_to_error_s", round(killer.seconds_since_fired(), 2))
    c = err.value.counters
    assert c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"]


@pytest.mark.timed
def test_killed_producer_work_moves_to_the_others(ray_cluster, tiny_model_path, data, tmp_path):
    from coati_relay import launch_distributed

    killer = AfterSteps(tmp_path / "cont", 2, kill_actor(ray_cluster, "producer-0"))
    killer.start()
    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "cont", backend="transformers",
                                             rounds=8, on_producer_failure="continue"))
    assert killer.fired_at is not None, killer.error
    assert len(result.history) == 8
    c = result.counters
    assert c["dead_producers"] == ["producer-0"]
    assert c["consumed"] == 8 * 2 and c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"]


def _recording_roles(out: Path):
    """A producer that saves its inference model's weights after each load (``producer-<i>-v<version>.pt``) and a
    consumer whose publisher saves each version it publishes (``published-v<version>.pt``), both into ``out``.
    Defined here, inside a function, so that Ray ships the classes by value to its actors."""
    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.roles.producer import ProducerWorker

    class RecordingProducer(ProducerWorker):
        def _load_fetched(self, version, tensors) -> None:
            import torch

            super()._load_fetched(version, tensors)
            state = {k: v.detach().clone() for k, v in self.backend.model.state_dict().items()}
            torch.save(state, out / f"{self.name}-v{self.backend.weight_version}.pt")

    class RecordingConsumer(ConsumerWorker):
        def _publish(self, version: int):
            if self.publisher is not None and not hasattr(self.publisher, "unrecorded_publish"):
                import torch

                publisher = self.publisher
                publisher.unrecorded_publish = publisher.publish

                def publish(v, tensors=None, **kwargs):
                    torch.save(tensors, out / f"published-v{v}.pt")
                    return publisher.unrecorded_publish(v, tensors=tensors, **kwargs)

                publisher.publish = publish
            return super()._publish(version)

    return RecordingProducer, RecordingConsumer


def test_collective_weight_sync(ray_cluster, tiny_model_path, data, tmp_path, monkeypatch):
    """The second WeightSync: consumer rank 0 broadcasts each version over gloo to both producers. Every version a
    producer loads holds, value for value, the weights the consumer published as that version."""
    import torch

    from coati_relay import launch_distributed
    from coati_relay.roles import consumer, producer

    out = tmp_path / "weights"
    out.mkdir()
    recording_producer, recording_consumer = _recording_roles(out)
    monkeypatch.setattr(producer, "ProducerWorker", recording_producer)
    monkeypatch.setattr(consumer, "ConsumerWorker", recording_consumer)
    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "coll", backend="transformers",
                                             rounds=4, weight_sync="collective"))
    assert [h["version"] for h in result.history] == [1, 2, 3, 4]
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "lock-step over broadcasts"
    assert result.history[0]["weight_bytes"] > 0

    published = {int(p.stem.split("-v")[1]): torch.load(p) for p in out.glob("published-v*.pt")}
    assert sorted(published) == [0, 1, 2, 3, 4]
    assert any(not torch.equal(published[3][k], v) for k, v in published[0].items()), "training moved the weights"
    loaded = {}
    for path in sorted(out.glob("producer-*-v*.pt")):
        name, version = path.stem.rsplit("-v", 1)
        got, want = torch.load(path), published[int(version)]
        assert want.keys() <= got.keys(), path.name
        for key, value in want.items():
            assert torch.equal(got[key], value), f"{path.name}: {key} differs from the published version {version}"
        loaded.setdefault(name, set()).add(int(version))
    assert sorted(loaded) == ["producer-0", "producer-1"] and all(0 in v for v in loaded.values()), loaded
    assert set.union(*loaded.values()) >= {0, 1, 2, 3}, f"every version a round needs was loaded: {loaded}"
