"""``train_model_config["gradient_checkpointing"]``: checked in the driver, applied to the consumer's policy, and
exact: the checkpointed policy recomputes its layers in the backward and gets the same gradients."""
from __future__ import annotations

import pytest
import torch

from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.training.booster_backend import load_causal_lm


def _layer_calls_and_grads(model: torch.nn.Module, input_ids: torch.Tensor):
    """Runs one training forward and backward; returns how often the first decoder layer's attention ran and the
    gradients."""
    calls = []
    model.model.layers[0].self_attn.register_forward_hook(lambda *_: calls.append(1))
    model.train()
    logits = model(input_ids=input_ids, use_cache=False).logits
    torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, input_ids[:, 1:, None]).sum().backward()
    return len(calls), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_checkpointed_layers_run_again_in_the_backward_with_the_same_gradients(tiny_model_path):
    input_ids = torch.randint(3, 300, (4, 24), generator=torch.Generator().manual_seed(0))
    plain = load_causal_lm(tiny_model_path)
    checkpointed = load_causal_lm(tiny_model_path, gradient_checkpointing=True)
    assert checkpointed.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    plain_calls, plain_grads = _layer_calls_and_grads(plain, input_ids)
    ckpt_calls, ckpt_grads = _layer_calls_and_grads(checkpointed, input_ids)
    assert (plain_calls, ckpt_calls) == (1, 2), "the checkpointed layer is recomputed once in the backward"
    assert plain_grads.keys() == ckpt_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def _config(model: str, tmp_path, **train_model_config):
    from coati_relay.toy import write_toy_dataset

    data = str(write_toy_dataset(tmp_path / "prompts.jsonl", num_prompts=8))
    return build_run_config(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1, inference_batch_size=4,
        inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
        train_dataset_config={"path": data, "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": model},
        generate_config={"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0},
        train_model_config={"path": model, **train_model_config},
        grpo_config={"lr": 1e-3, "reward_fn_type": "toy_letter"}, plugin_config={"plugin": "ddp"},
        inference_backend="transformers",
        num_generations=2, core_algo="GRPO", run_dir=str(tmp_path / "run"), colocate=True)


def test_the_setting_is_a_bool_checked_before_anything_starts(tiny_model_path, tmp_path):
    assert _config(tiny_model_path, tmp_path).models.gradient_checkpointing is False
    with pytest.raises(ConfigError, match=r"train_model_config\['gradient_checkpointing'\] must be True or False"):
        _config(tiny_model_path, tmp_path, gradient_checkpointing="yes")


@pytest.mark.slow
def test_the_consumer_trains_a_checkpointed_policy_without_shared_prompts(tiny_model_path, tmp_path):
    from coati_relay.roles.consumer import ConsumerWorker

    cfg = _config(tiny_model_path, tmp_path, gradient_checkpointing=True)
    assert cfg.models.gradient_checkpointing is True
    consumer = ConsumerWorker(0, cfg, queue=None, weight_store=None)
    policy = consumer.setup_colocated()
    assert policy.is_gradient_checkpointing
    # a prompt's cache shared over two forwards would be extended again when a layer is recomputed
    assert not consumer.policy.shares_prompts
