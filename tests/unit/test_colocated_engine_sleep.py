"""A colocated run with an engine holding its own weights (vLLM): on CUDA it starts on what the trainer left of
the GPU, sleeps while the policy trains and wakes before the trained weights load. Shown with a fake engine (a
transformers generator with the engine's sleep and wake calls) on the CPU."""
from __future__ import annotations

import pytest

from coati_relay.inference import vllm_spec
from coati_relay.roles.consumer import ConsumerWorker

pytestmark = pytest.mark.slow

GIB = 2 ** 30


def test_the_engine_takes_a_share_of_what_the_trainer_left():
    kw = vllm_spec.colocated_engine_kwargs({"enforce_eager": True}, free_bytes=40 * GIB, total_bytes=80 * GIB)
    assert kw == {"enforce_eager": True, "enable_sleep_mode": True, "gpu_memory_utilization": 0.42}
    sized = {"gpu_memory_utilization": 0.3, "enable_sleep_mode": False}
    assert vllm_spec.colocated_engine_kwargs(sized, 40 * GIB, 80 * GIB) == sized, "the user's settings stand"
    with pytest.raises(RuntimeError, match="left 2.0 of 80.0 GiB free"):
        vllm_spec.colocated_engine_kwargs({}, free_bytes=2 * GIB, total_bytes=80 * GIB)


def test_the_engine_sleeps_while_the_policy_trains_and_wakes_before_the_weights_load(tiny_model_path, tmp_path,
                                                                                    monkeypatch):
    from coati_relay import launch_distributed
    from coati_relay.inference.transformers_backend import TransformersBackend
    from coati_relay.toy import write_toy_dataset

    calls = []

    class FakeEngine:
        """Generates with transformers; records the calls a colocated run makes on a vLLM engine."""

        shared = False
        sleeps = True  # a vLLM engine built with enable_sleep_mode

        def __init__(self, name, model_path, sampling, tokenizer=None, seed=0, **kwargs):
            self.inner = TransformersBackend(model_path, sampling, tokenizer=tokenizer, seed=seed)
            self.device, self.weight_version, self.asleep = self.inner.device, 0, False

        def generate(self, prompts, n, info=None):
            assert not self.asleep, "generate on a sleeping engine"
            calls.append("generate")
            self.inner.weight_version = self.weight_version
            return self.inner.generate(prompts, n, info)

        def sleep(self):
            calls.append("sleep")
            self.asleep = True

        def wake_up(self):
            calls.append("wake_up")
            self.asleep = False

        def close(self):
            self.inner.close()

        def load_weights(self, version, tensors):
            assert not self.asleep, "weights loaded into a sleeping engine"
            calls.append("load_weights")
            self.inner.load_weights(version, tensors)
            self.weight_version = version

    train_round = ConsumerWorker.train_round

    def recorded_train_round(self, batch):
        calls.append("train")
        return train_round(self, batch)

    monkeypatch.setattr("coati_relay.inference.build_inference_backend", FakeEngine)
    monkeypatch.setattr(ConsumerWorker, "train_round", recorded_train_round)
    data = write_toy_dataset(tmp_path / "p.jsonl", num_prompts=8)
    result = launch_distributed(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1, inference_batch_size=4,
        inference_microbatch_size=2, train_batch_size=4, train_minibatch_size=4,
        train_dataset_config={"path": str(data), "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": tiny_model_path},
        train_model_config={"path": tiny_model_path},
        generate_config={"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0},
        grpo_config={"reward_fn_type": "toy_letter"}, plugin_config={"plugin": "ddp"}, inference_backend="vllm",
        num_generations=2, colocate=True, run_dir=str(tmp_path / "run"), progress=False)
    assert [h["version"] for h in result.history] == [1, 2]
    one_round = ["generate", "generate", "sleep", "train", "wake_up", "load_weights"]
    assert calls == one_round * 2, calls
