"""The legacy strategies hold one engine `TrainingBackend` per prepared model and train through it."""
from __future__ import annotations

import warnings

import pytest
import torch

from coati_compat.legacy.strategies import NaiveStrategy
from coati_relay.training.finite_checks import NonFiniteTrainingError
from coati_relay.training.master_weights import MasterWeightOptimizer

warnings.simplefilter("ignore", FutureWarning)


def linear(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(6, 3).to(dtype)


def test_one_backend_per_prepared_model():
    strategy = NaiveStrategy()
    frozen, model = linear().requires_grad_(False), linear(seed=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    prepared_frozen, (prepared, prepared_optim) = strategy.prepare(frozen, (model, optimizer))
    assert [b.model for b in strategy.backends] == [frozen, model]
    assert prepared_frozen is frozen and prepared is model and prepared_optim is optimizer
    assert strategy.backends[1].optimizer is optimizer and strategy.backends[0].optimizer is None


def test_the_scripts_own_optimizer_object_steps_the_fp32_masters():
    """A script that keeps using the optimizer it built (not the one prepare returned) trains the fp16 model."""
    strategy = NaiveStrategy()
    model = linear(torch.float16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    _, prepared_optim = strategy.prepare((model, optimizer))
    assert isinstance(prepared_optim, MasterWeightOptimizer) and prepared_optim.optim is optimizer
    start = model.weight.detach().clone()
    x = 0.1 * torch.randn(4, 6).half()
    for _ in range(3):
        strategy.backward(model(x).float().mean(), model, optimizer)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
    assert torch.isfinite(model.weight).all() and not torch.equal(model.weight, start)
    assert prepared_optim.skipped_steps == 0 and len(strategy.backends) == 1


def test_an_overflowing_fp16_step_does_not_poison_the_next_one():
    """The script zeroes the optimizer it built (its groups hold the masters): the overflowed fp16 gradient must
    not stay in the model for the next step."""
    strategy = NaiveStrategy()
    model = linear(torch.float16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    _, prepared_optim = strategy.prepare((model, optimizer))
    start = model.weight.detach().clone()
    for scale in (1e4, 0.1):  # the first overflows at the loss scale 2 ** 16, the second does not
        strategy.backward(model(torch.full((4, 6), scale).half()).float().mean(), model, optimizer)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
    assert prepared_optim.skipped_steps == 1
    assert torch.isfinite(model.weight).all() and not torch.equal(model.weight, start)


def test_a_non_finite_loss_stops_through_the_strategy():
    strategy = NaiveStrategy()
    model, = strategy.prepare((linear(), None))[:1]
    loss = model(torch.full((1, 6), float("nan"))).sum()
    with pytest.raises(NonFiniteTrainingError, match="training step 1: the Linear loss is not finite"):
        strategy.backward(loss, model, None)


def test_fp16_master_state_round_trips_through_the_strategy_files(tmp_path):
    strategy = NaiveStrategy()
    model = linear(torch.float16)
    model, optim = strategy.prepare((model, torch.optim.Adam(model.parameters(), lr=1e-2)))
    strategy.backward(model(torch.randn(2, 6).half()).float().sum(), model, optim)
    strategy.optimizer_step(optim)
    strategy.save_optimizer(optim, str(tmp_path / "optim.pt"))
    strategy.save_model(model, str(tmp_path / "model.pt"))
    other_strategy = NaiveStrategy()
    other = linear(torch.float16, seed=5)
    other, other_optim = other_strategy.prepare((other, torch.optim.Adam(other.parameters(), lr=1e-2)))
    other_strategy.load_optimizer(other_optim, str(tmp_path / "optim.pt"))
    other_strategy.load_model(other, str(tmp_path / "model.pt"))
    assert torch.equal(other.weight, model.weight)
    assert other_optim.loss_scale.scale == optim.loss_scale.scale
    for mine, theirs in zip(optim.param_groups[0]["params"], other_optim.param_groups[0]["params"]):
        assert mine.dtype == torch.float32 and torch.equal(mine, theirs)


@pytest.mark.parametrize("plugin,options,cuda,expected", [
    (None, {}, False, True), ("ddp", {}, True, True), ("zero2", {"cpu_offload": False}, True, True)])
def test_the_ppo_trainer_picks_adam_as_the_engine_picks_its_optimizer(monkeypatch, plugin, options, cuda,
                                                                      expected):
    """torch's fused Adam on CUDA where the plugin needs no HybridAdam (the legacy trainer built HybridAdam under
    LowLevelZero, whose kernel build took minutes on a GPU host), and on the CPU."""
    from types import SimpleNamespace

    from coati_compat.shims import ppo_trainer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    optimizer = ppo_trainer._legacy_adam(SimpleNamespace(plugin_name=plugin, plugin_options=options), linear(), 1e-3)
    assert type(optimizer) is torch.optim.Adam and optimizer.defaults["fused"] is expected
    assert optimizer.defaults["lr"] == 1e-3
