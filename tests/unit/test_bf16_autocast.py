"""``ddp`` with ``precision="bf16"``: float32 weights, gradients and optimizer state, the trained models' forwards
under bf16 autocast (`training.plugins.autocast_dtype`, `TrainingBackend.forward_precision`); what ColossalChat's
default ``precision`` trains with on a host without CUDA."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from train_round_helpers import make_config, make_rollout

from coati_relay.training import float32_attention, plugins
from coati_relay.training.plugins import autocast_dtype, build_plugin, resolve_plugin

PROMPTS = [[3, 4, 5], [6], [7, 8], [9, 10]]
RESPONSES = [[11, 12, 13], [14], [15, 16], [17, 18, 19, 20], [12, 12], [13, 21, 14], [15], [16, 17, 18]]
REWARDS = [1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.0, 1.0]


def test_ddp_takes_fp32_or_bf16_and_only_bf16_autocasts():
    assert resolve_plugin("ddp", {"precision": "bf16"}, cuda_available=False) == ("ddp", {"precision": "bf16"})
    assert autocast_dtype("ddp", {"precision": "bf16"}) == "bfloat16"
    assert autocast_dtype("ddp", {"precision": "fp32"}) is None and autocast_dtype("ddp", {}) is None
    assert autocast_dtype("hybrid", {"precision": "bf16"}) is None  # bf16 weights there, no autocast
    assert autocast_dtype(None) is None
    with pytest.raises(ValueError, match=r"plugin 'ddp': precision must be one of \['bf16', 'fp32'\]"):
        resolve_plugin("ddp", {"precision": "fp16"}, cuda_available=False)


def test_the_plugin_is_built_without_the_engines_own_option(monkeypatch):
    seen = {}
    entry = plugins.PLUGINS["ddp"]
    monkeypatch.setitem(plugins.PLUGINS, "ddp", entry._replace(factory=lambda **kw: seen.update(kw) or "plugin"))
    assert build_plugin("ddp", {"precision": "bf16", "bucket_cap_mb": 5}) == "plugin"
    assert seen == {"bucket_cap_mb": 5}


class Dtypes:
    """The output dtypes of every ``nn.Linear`` of the given models, with whether gradients were on."""

    def __init__(self, *models: nn.Module):
        self.seen = []
        for model in models:
            for module in model.modules():
                if isinstance(module, nn.Linear):
                    module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.seen.append((torch.is_grad_enabled(), output.dtype))


def test_a_grpo_round_forwards_in_bf16_keeps_float32_weights_and_a_zero_first_kl(tiny_model_path, tmp_path):
    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.toy import write_toy_dataset
    from coati_relay.training.booster_backend import load_causal_lm

    data = str(write_toy_dataset(tmp_path / "p.jsonl", num_prompts=16))
    cfg = make_config(tiny_model_path, data, train_batch_size=4, microbatch=4, beta=0.1,
                      plugin_config={"plugin": "ddp", "precision": "bf16"})
    policy, reference = load_causal_lm(tiny_model_path), load_causal_lm(tiny_model_path)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    rollout = make_rollout(PROMPTS, RESPONSES, 2, REWARDS, policy=policy)  # float32 behaviour log-probs
    worker = ConsumerWorker.for_models(cfg, policy, reference=reference)
    assert worker.policy.autocast is torch.bfloat16
    # on the CPU, attention in float32 (its bf16 flash-attention backward is slow there)
    assert policy.config._attn_implementation == reference.config._attn_implementation == float32_attention.NAME
    dtypes = Dtypes(policy, reference)
    stats = worker.train_round(rollout)  # one optimizer step of two micro-batches
    assert {dtype for _, dtype in dtypes.seen} == {torch.bfloat16}
    assert any(grad for grad, _ in dtypes.seen) and not all(grad for grad, _ in dtypes.seen)
    # the reference runs in the policy's precision: equal weights give equal log-probs, so the first KL is 0
    assert stats["kl"] == 0.0
    moved = 0
    for name, value in policy.state_dict().items():
        assert value.dtype == torch.float32 and torch.isfinite(value).all(), name
        moved += not torch.equal(value, before[name])
    assert moved > len(before) // 2
    for state in worker.policy.optimizer.state_dict()["state"].values():
        assert state["exp_avg"].dtype == torch.float32


def test_float32_attention_under_autocast_computes_attention_in_float32(tiny_model_path, monkeypatch):
    from coati_relay.training.booster_backend import load_causal_lm

    plain, up = load_causal_lm(tiny_model_path), load_causal_lm(tiny_model_path)
    assert float32_attention.use_float32_attention(up)
    assert not float32_attention.use_float32_attention(torch.nn.Linear(2, 2))
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = plain(input_ids=ids).logits
        seen = []
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def recording(q, k, v, *args, **kwargs):
            seen.append((q.dtype, k.dtype, v.dtype, torch.is_autocast_enabled("cpu")))
            return sdpa(q, k, v, *args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
        got = up(input_ids=ids).logits
    assert len(seen) == up.config.num_hidden_layers
    assert set(seen) == {(torch.float32, torch.float32, torch.float32, False)}
    assert got.dtype == reference.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), reference.float(), rtol=0.05, atol=0.05)
