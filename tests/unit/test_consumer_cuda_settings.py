"""What a consumer asks of its plugin and models for a CUDA host, checked on the CPU: the plugin keywords (Gemini's
gradient accumulation), the reference model's dtype (the training precision's), eval mode (no dropout) for the
forwards without gradient and train mode for the update."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from train_round_helpers import BigramLM, TokenCritic, make_config, make_rollout

from coati_relay.config.schema import Plugin
from coati_relay.roles.consumer import ConsumerWorker
from coati_relay.training import booster_backend


@pytest.fixture(scope="module")
def paths(tiny_model_path, tmp_path_factory):
    from coati_relay.toy import write_toy_dataset

    return tiny_model_path, str(write_toy_dataset(tmp_path_factory.mktemp("data") / "p.jsonl", num_prompts=16))


class RecordedBackend:
    """Stands for `TrainingBackend`: records its keywords; trains nothing."""

    made: list = []

    def __init__(self, model, lr, **kwargs):
        self.made.append(kwargs)
        self.device = torch.device("cpu")
        self.plugin_name = kwargs["plugin"]

    def prepare_forwards(self, model):
        pass


@pytest.mark.parametrize("microbatch, accumulates", [(2, True), (8, False)])
def test_gemini_gets_gradient_accumulation_when_the_consumer_accumulates(paths, monkeypatch, microbatch, accumulates):
    cfg = make_config(*paths, core_algo="PPO", train_batch_size=4, group_size=2, microbatch=microbatch)
    cfg = replace(cfg, plugin=Plugin("gemini", {"precision": "bf16"}, allow_cpu_fallback=False))
    monkeypatch.setattr(booster_backend, "TrainingBackend", RecordedBackend)
    RecordedBackend.made = []
    ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1), critic=TokenCritic())
    assert [kw["plugin"] for kw in RecordedBackend.made] == ["gemini", "gemini"], "policy and critic"
    for kw in RecordedBackend.made:
        expected = {"precision": "bf16", **({"enable_gradient_accumulation": True} if accumulates else {})}
        assert kw["plugin_options"] == expected


@pytest.mark.parametrize("plugin, options, dtype", [("zero2", {"stage": 2, "precision": "bf16"}, torch.bfloat16),
                                                    ("gemini", {"precision": "fp16"}, torch.float16),
                                                    ("ddp", {}, torch.float32)])
def test_the_reference_model_computes_in_the_training_precision(paths, monkeypatch, plugin, options, dtype):
    """The plugins run the policy's forward in their precision: a float32 reference would make the KL non-zero at
    the first step."""
    cfg = make_config(*paths, beta=0.1)
    cfg = replace(cfg, plugin=Plugin(plugin, options, allow_cpu_fallback=False))
    monkeypatch.setattr(booster_backend, "TrainingBackend", RecordedBackend)
    worker = ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1))
    assert worker.learner.reference.table.dtype == dtype and not worker.learner.reference.training


@pytest.mark.parametrize("backend, colocate, given, expected", [
    ("vllm", False, {}, "bfloat16"), ("vllm", True, {}, "bfloat16"), ("vllm", False, {"dtype": "float32"}, "float32"),
    ("transformers", False, {}, torch.bfloat16), ("transformers", True, {}, None)])
def test_the_engine_dtype_follows_the_training_precision(paths, monkeypatch, backend, colocate, given, expected):
    """bf16 plugins (zero2 by default) give a bf16 engine unless the user chose a dtype; a colocated transformers
    producer generates with the training model itself."""
    from coati_relay.assembly.build import build_run_config
    from coati_relay.training import plugins

    monkeypatch.setattr(plugins, "_cuda_available", lambda: True)
    model, data = paths
    cfg = build_run_config(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1, inference_batch_size=8,
        inference_microbatch_size=2, train_batch_size=2, train_minibatch_size=2,
        train_dataset_config={"path": data, "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": model, **given},
        generate_config={"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0}, train_model_config={"path": model},
        grpo_config={"reward_fn_type": "toy_letter"},
        plugin_config={"plugin": "zero2"}, inference_backend=backend, num_generations=2, colocate=colocate,
        progress=False)
    assert cfg.models.inference_model_kwargs.get("dtype") == expected


class ModeRecorder(BigramLM):
    """A `BigramLM` that records (training mode, gradient enabled) at each forward."""

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.calls = []

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        self.calls.append((self.training, torch.is_grad_enabled()))
        return super().forward(input_ids, attention_mask, position_ids)


class CriticModeRecorder(TokenCritic):
    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, input_ids, attention_mask):
        self.calls.append((self.training, torch.is_grad_enabled()))
        return super().forward(input_ids, attention_mask)


def test_old_logprobs_and_values_are_computed_in_eval_mode_and_the_update_in_train_mode(paths):
    """Dropout (0.1 in GPT-2 and OPT) must not enter the recomputed old log-probs (top-k sampling) nor the values
    GAE uses; the update trains with it."""
    policy, critic = ModeRecorder(), CriticModeRecorder()
    cfg = make_config(*paths, core_algo="PPO", group_size=2, kl_coef=0.1, generate={"top_k": 4})
    worker = ConsumerWorker.for_models(cfg, policy, reference=BigramLM(seed=1), critic=critic)
    rollout = make_rollout([[3, 4], [5]], [[1, 2], [3], [4, 5, 6], [7]], 2, [1.0, 0.0, 0.5, 0.0], policy=BigramLM())
    for _ in range(2):  # the second round starts where the first round's update left the modes
        worker.train_round(rollout)
    for name, calls in (("policy", policy.calls), ("critic", critic.calls)):
        assert {grad for _, grad in calls} == {True, False}, f"{name}: forwards with and without gradient"
        assert all(training == grad for training, grad in calls), f"{name} (training, grad) per forward: {calls}"


def test_an_optimizer_step_syncs_with_the_host_as_often_whatever_its_micro_batches(paths, monkeypatch):
    """Metrics stay tensors on the device over a step's micro-batches and are read once: on CUDA each read
    (``item``, ``tolist``) waits for the GPU."""
    reads = []
    for name in ("item", "tolist"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, _f=original, _n=name: reads.append(_n) or _f(self))
    rollout = make_rollout([[3, 4], [5], [6], [7, 8]], [[1, 2], [3], [4, 5, 6], [7], [2], [3, 4], [5], [6, 7]], 2,
                           [1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 1.0], policy=BigramLM())
    counts = {}
    for microbatch in (8, 1):
        cfg = make_config(*paths, core_algo="PPO", train_batch_size=4, group_size=2, kl_coef=0.1,
                          microbatch=microbatch)
        worker = ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1), critic=TokenCritic())
        reads.clear()
        worker.learner.optimizer_step(worker_rows(worker, rollout), rollout.response_ids.size(1))
        counts[microbatch] = len(reads)
    assert counts[1] == counts[8], f"host reads per step by micro-batch size: {counts}"


def worker_rows(worker, rollout):
    """The `StepRows` of a whole rollout as `train_round` makes them (advantages of zeros: the reads are counted,
    not the update)."""
    from coati_relay.roles.learner import StepRows

    n, r = rollout.num_sequences, rollout.response_ids.size(1)
    mask = rollout.response_mask.float()
    return StepRows(rollout.sequences, rollout.attention_mask, mask, rollout.logprobs, torch.zeros(n, r),
                    torch.ones(n), rollout.logprobs, torch.zeros(n, r), torch.zeros(n, r))
