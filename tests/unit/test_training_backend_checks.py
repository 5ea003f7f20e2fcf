"""`TrainingBackend`'s own non-finite checks and fp32 master weights, and `TrainingBackend.around` (a model and
optimizer built elsewhere), on tiny CPU models."""
from __future__ import annotations

import pytest
import torch

from coati_relay.training.booster_backend import TrainingBackend
from coati_relay.training.finite_checks import NonFiniteTrainingError
from coati_relay.training.master_weights import MasterWeightOptimizer


def linear(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 2).to(dtype)


def test_a_non_finite_loss_stops_before_its_backward_naming_the_batch():
    backend = TrainingBackend.around(linear(), None, name="policy")
    backend.optimizer = torch.optim.SGD(backend.model.parameters(), lr=0.1)
    x = torch.ones(3, 4)
    x[1, 2] = float("inf")
    loss = backend.model(x).sum()
    with pytest.raises(NonFiniteTrainingError, match=r"training step 1: pg_loss is not finite.* \['x'\]"):
        backend.backward(loss, batch={"x": x, "ids": torch.arange(3)}, loss_name="pg_loss")
    assert all(p.grad is None for p in backend.model.parameters())
    with pytest.raises(NonFiniteTrainingError, match="training step 1: the policy loss .* forward pass overflowed"):
        backend.backward(loss)


def test_a_step_that_makes_weights_non_finite_stops_there():
    model = linear()
    backend = TrainingBackend.around(model, torch.optim.SGD(model.parameters(), lr=1e34), name="critic")
    backend.backward(model(torch.zeros(2, 4)).sum())
    backend.step()  # only the bias moves (by 2e34): finite
    backend.zero_grad()
    backend.backward(model(torch.full((2, 4), 1e5)).sum())  # an update of 1e34 * 2e5 overflows float32
    with pytest.raises(NonFiniteTrainingError, match=r"training step 2: the critic holds inf/NaN weights .* "
                                                     r"diverged \(learning rates \[1e\+34\]\)"):
        backend.step()


def test_check_finite_false_lets_non_finite_values_through():
    model = linear()
    backend = TrainingBackend.around(model, torch.optim.SGD(model.parameters(), lr=0.1), check_finite=False)
    backend.backward(model(torch.full((1, 4), float("nan"))).sum())
    backend.step()
    assert torch.isnan(model.weight).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_models_step_fp32_masters_and_report_the_unscaled_norm(dtype):
    """The same updates as the fp32 model, within the low-precision rounding; the grad norm is the fp32 one, not
    the loss-scaled one."""
    x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), torch.zeros(8, 2)
    results = {}
    for kind in (torch.float32, dtype):
        model = linear(kind)
        backend = TrainingBackend.around(model, torch.optim.Adam(model.parameters(), lr=1e-2),
                                         loss_scale={"initial_scale": 2 ** 10})
        norms = []
        for _ in range(3):
            backend.backward(((model(x.to(kind)).float() - y) ** 2).mean())
            norms.append(backend.step()["grad_norm"])
            backend.zero_grad()
        results[kind] = (model.weight.detach().float().clone(), norms, backend.optimizer)
    weight, norms, optimizer = results[dtype]
    assert isinstance(optimizer, MasterWeightOptimizer) and not isinstance(results[torch.float32][2],
                                                                           MasterWeightOptimizer)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(weight, results[torch.float32][0], rtol=0, atol=tol)
    assert norms == pytest.approx(results[torch.float32][1], rel=3e-2)


def test_around_without_an_optimizer_cannot_step_and_keeps_boost_extras():
    model = linear()
    backend = TrainingBackend.around(model, None, criterion=torch.nn.MSELoss())
    assert backend.model is model and isinstance(backend.boost_extras["criterion"], torch.nn.MSELoss)
    with pytest.raises(ValueError, match="holds no optimizer"):
        backend.step()
    with pytest.raises(TypeError, match=r"unknown arguments \['scheduler'\]"):
        TrainingBackend.around(model, None, scheduler=None)


def test_all_finite_finds_inf_and_nan_and_is_not_fooled_by_an_overflowing_sum():
    from coati_relay.training.master_weights import all_finite

    big = torch.full((2,), 3e38)  # finite elements whose sum overflows float32
    ones = torch.ones(70000, dtype=torch.float16)  # whose sum overflows float16
    assert all_finite([big, ones, torch.zeros(0)]) and all_finite([])
    for bad in (float("nan"), float("inf"), -float("inf")):
        tensor = torch.zeros(5, dtype=torch.bfloat16)
        tensor[3] = bad
        assert not all_finite([big, tensor])
