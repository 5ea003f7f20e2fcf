"""fp16/bf16 legacy models under strategies without master weights: fp32 masters, loss scale, non-finite stops."""
from __future__ import annotations

import pytest
import torch

from coati_compat.legacy.experience import Experience
from coati_compat.legacy.model_families import LlamaActor, LlamaCritic
from coati_compat.legacy.strategies import NaiveStrategy
from coati_compat.shims.ppo_trainer import DetachedPPOTrainerImpl
from coati_relay.toy import tiny_config
from coati_relay.training.finite_checks import NonFiniteTrainingError, check_weights
from coati_relay.training.master_weights import DynamicLossScale, MasterWeightOptimizer, find_master_optimizer

CFG = tiny_config("llama")


def linear(dtype, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(8, 4).to(dtype)


def train_linear(model, optimizer, strategy, steps=5):
    """A few steps of a regression in which the bias gets gradient only in its first two entries."""
    torch.manual_seed(1)
    x, y = torch.randn(16, 8), torch.randn(16, 2)
    for _ in range(steps):
        out = model(x.to(model.weight.dtype)).float()
        loss = ((out[:, :2] - y) ** 2).mean()
        strategy.backward(loss, model, optimizer)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
    return model


def test_fp16_adam_without_masters_makes_nan_weights():
    """The failure the masters exist for: Adam's eps is 0 in fp16, so an element with zero gradient becomes 0/0."""
    model = linear(torch.float16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    (model.weight.float().sum() + model.bias[:2].float().sum()).backward()
    optimizer.step()
    assert torch.isnan(model.bias[2:]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_naive_strategy_trains_low_precision_models_on_fp32_masters(dtype):
    strategy = NaiveStrategy()
    reference = linear(torch.float32)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    _, ref_opt = strategy.prepare((reference, ref_opt))
    assert not isinstance(ref_opt, MasterWeightOptimizer)  # fp32 scripts keep their optimizer and numbers
    train_linear(reference, ref_opt, strategy)

    model = linear(dtype)
    start = model.weight.detach().clone()
    model, optimizer = strategy.prepare((model, torch.optim.Adam(model.parameters(), lr=1e-2)))
    assert isinstance(optimizer, MasterWeightOptimizer)
    assert (optimizer.loss_scale is not None) == (dtype == torch.float16)
    train_linear(model, optimizer, strategy)
    assert model.weight.dtype == dtype
    assert torch.isfinite(model.weight).all() and torch.isfinite(model.bias).all()
    assert not torch.equal(model.weight, start)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(model.weight.float(), reference.weight, rtol=0, atol=tol)
    torch.testing.assert_close(model.bias.float(), reference.bias, rtol=0, atol=tol)


def test_fp16_overflow_skips_the_step_and_lowers_the_scale():
    model = linear(torch.float16)
    start = model.weight.detach().clone()
    optimizer = MasterWeightOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), initial_scale=2 ** 30,
                                      hysteresis=1)
    optimizer.backward(model(torch.full((2, 8), 100.0, dtype=torch.float16)).float().sum())
    assert optimizer.step() is None
    assert optimizer.skipped_steps == 1 and optimizer.loss_scale.scale == 2 ** 29
    assert torch.equal(model.weight, start)


def test_loss_scale_grows_after_clean_steps_and_honours_hysteresis():
    scale = DynamicLossScale(initial_scale=8, growth_interval=2, hysteresis=2)
    scale.update(overflow=True)
    assert scale.scale == 8  # the first overflow is absorbed by the hysteresis
    scale.update(overflow=True)
    assert scale.scale == 4
    scale.update(overflow=False)
    scale.update(overflow=False)
    assert scale.scale == 8
    with pytest.raises(ValueError, match="initial_scale"):
        DynamicLossScale(initial_scale=0.5)


def test_master_state_round_trips():
    model = linear(torch.float16)
    optimizer = MasterWeightOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2))
    train_linear(model, optimizer, NaiveStrategy(), steps=2)
    saved = optimizer.state_dict()
    other = linear(torch.float16, seed=3)
    other_opt = MasterWeightOptimizer(torch.optim.Adam(other.parameters(), lr=1e-2))
    other_opt.load_state_dict(saved)
    assert torch.equal(other.weight, model.weight)
    assert other_opt.loss_scale.scale == optimizer.loss_scale.scale


def test_masters_need_a_fresh_optimizer():
    model = linear(torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    with pytest.raises(ValueError, match="before the optimizer's first step"):
        MasterWeightOptimizer(optimizer)


def test_weight_check_names_the_step_and_missing_masters():
    model = linear(torch.float16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    (model.weight.float().sum() + model.bias[:2].float().sum()).backward()
    optimizer.step()
    with pytest.raises(NonFiniteTrainingError, match=r"training step 7: the actor .* without fp32 master weights"):
        check_weights(7, {"actor": model}, {"actor": optimizer})
    assert find_master_optimizer(optimizer) is None


def half_models():
    torch.manual_seed(0)
    return LlamaActor(config=CFG).half(), LlamaCritic(config=CFG, use_action_mask=True).half()


def batch(reward_nan=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(2, 300, (2, 12), generator=g)
    reward = torch.randn(2, generator=g)
    if reward_nan:
        reward[1] = float("nan")
    return Experience(seq, -torch.rand(2, 4, generator=g) * 3, torch.randn(2, generator=g), reward,
                      torch.randn(2, 1, generator=g), torch.ones(2, 12, dtype=torch.long), torch.ones(2, 4).bool())


def test_ppo_trainer_trains_half_models_to_finite_moved_weights():
    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, half_models, actor_lr=1e-3, critic_lr=1e-3)
    start = {k: v.detach().clone() for k, v in trainer.actor.state_dict().items()}
    for step in range(4):
        trainer.training_step(batch(seed=step))
    weights = trainer.actor.state_dict()
    assert all(torch.isfinite(v).all() for v in weights.values())
    assert any(not torch.equal(v, start[k]) for k, v in weights.items())
    assert all(v.dtype == torch.float16 for v in weights.values() if v.is_floating_point())
    assert trainer.steps_done == 4


def test_ppo_trainer_stops_at_the_step_with_a_non_finite_batch():
    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, half_models, actor_lr=1e-3, critic_lr=1e-3)
    trainer.training_step(batch())
    critic_before = {k: v.detach().clone() for k, v in trainer.critic.state_dict().items()}
    with pytest.raises(NonFiniteTrainingError, match=r"training step 2: critic_loss .* \['reward'\]"):
        trainer.training_step(batch(reward_nan=True))
    assert all(torch.equal(v, critic_before[k]) for k, v in trainer.critic.state_dict().items())
