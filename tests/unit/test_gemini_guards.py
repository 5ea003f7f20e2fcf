"""What `TrainingBackend` does around a Gemini-held model, checked on the CPU (Gemini itself needs CUDA; the GPU lane
runs the real thing): the load pre-hook that folds tied aliases, against a loader with GeminiDDP's strict key check;
the refusal of a second backward before the step without gradient accumulation; the step checked from Gemini's
overflow count instead of reading the weights."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from coati_relay.training import booster_backend, finite_checks
from coati_relay.training.booster_backend import TrainingBackend
from coati_relay.training.finite_checks import NonFiniteTrainingError
from coati_relay.training.gemini_guards import (
    AliasLoad,
    GeminiStepGuard,
    GradientAccumulationError,
    releases_parameters,
    tied_aliases,
)


def tied_gpt2(seed: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=8, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config)


class GeminiShapedLoader(nn.Module):
    """Stands for GeminiDDP's load path (colossalai 0.5): its ``state_dict`` writes every name of a tied parameter;
    its ``load_state_dict`` copies the dict, calls each load pre-hook with torch's arguments, loads the names
    ``named_parameters()`` gives and, strict, reports every other key as unexpected."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        return self.module.named_modules(memo, prefix, remove_duplicate)

    def state_dict(self, *args, **kwargs):
        out = {}
        for module_name, sub in self.module.named_modules():
            for name, p in sub.named_parameters(recurse=False):
                out[f"{module_name}.{name}" if module_name else name] = p.detach().clone()
        return out

    def load_state_dict(self, state_dict, strict: bool = True):
        state_dict = dict(state_dict)
        missing, unexpected, errors = [], [], []
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, "", {}, True, missing, unexpected, errors)
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, p in params.items():
                if name in state_dict:
                    p.copy_(state_dict[name])
                else:
                    missing.append(name)
        unexpected += [k for k in state_dict if k not in params]
        if strict and unexpected:
            errors.insert(0, "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected))
        if strict and missing:
            errors.insert(0, "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for GeminiDDP:\n\t" + "\n\t".join(errors))


def test_the_aliases_of_a_tied_model_are_its_second_names():
    assert tied_aliases(tied_gpt2(0)) == {"lm_head.weight": "transformer.wte.weight"}
    assert tied_aliases(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) == {}


@pytest.mark.parametrize("writer", ["gemini", "hf"])
def test_a_state_dict_with_both_tied_names_loads_strictly_once_the_aliases_fold(writer):
    source, target = GeminiShapedLoader(tied_gpt2(0)), GeminiShapedLoader(tied_gpt2(1))
    state = source.state_dict() if writer == "gemini" else source.module.state_dict()
    assert {"lm_head.weight", "transformer.wte.weight"} <= set(state)
    with pytest.raises(RuntimeError, match='Unexpected key.*"lm_head.weight"'):
        target.load_state_dict(state)  # the failure the GPU lane saw
    assert AliasLoad.install(target) == {"lm_head.weight": "transformer.wte.weight"}
    target.load_state_dict(state)
    for (name, got), want in zip(target.module.named_parameters(), source.module.parameters()):
        assert torch.equal(got, want), name
    assert "lm_head.weight" in state, "the caller's dict is left as it was"
    assert target.module.lm_head.weight is target.module.transformer.wte.weight


def test_an_alias_alone_loads_under_the_first_name():
    source, target = GeminiShapedLoader(tied_gpt2(0)), GeminiShapedLoader(tied_gpt2(1))
    state = source.state_dict()
    state.pop("transformer.wte.weight")
    AliasLoad.install(target)
    target.load_state_dict(state)
    assert torch.equal(target.module.transformer.wte.weight, source.module.transformer.wte.weight)


def test_different_values_under_tied_names_are_an_error():
    target = GeminiShapedLoader(tied_gpt2(1))
    state = GeminiShapedLoader(tied_gpt2(0)).state_dict()
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    AliasLoad.install(target)
    with pytest.raises(RuntimeError, match="name one tied parameter"):
        target.load_state_dict(state)


def gemini_model(overflows: int = 0, *keep_gathered: bool):
    """Stands for a GeminiDDP where the guard reads it: its chunk manager's overflow counter and chunks."""
    chunks = [SimpleNamespace(keep_gathered=k) for k in keep_gathered]
    return SimpleNamespace(chunk_manager=SimpleNamespace(overflow_counter=torch.tensor([overflows], dtype=torch.int),
                                                         chunk_groups={"fp16_param": chunks}))


def test_a_second_backward_before_the_step_is_refused_unless_gemini_accumulates():
    guard = GeminiStepGuard(gemini_model(), {"precision": "bf16"}, "policy")
    guard.before_backward()
    with pytest.raises(GradientAccumulationError, match="enable_gradient_accumulation"):
        guard.before_backward()
    guard.stepped()
    guard.before_backward()  # one backward a step
    accumulating = GeminiStepGuard(gemini_model(), {"enable_gradient_accumulation": True}, "policy")
    for _ in range(3):
        accumulating.before_backward()


def test_the_overflow_count_is_read_as_new_chunks_since_the_last_step_and_not_under_fp16():
    model = gemini_model(0)
    guard = GeminiStepGuard(model, {"precision": "bf16"}, "policy")
    assert guard.non_finite_gradients() == 0
    model.chunk_manager.overflow_counter += 2  # bf16: Gemini never resets it
    assert guard.non_finite_gradients() == 2
    assert guard.non_finite_gradients() == 0
    assert GeminiStepGuard(gemini_model(3), {"precision": "fp16"}, "policy").non_finite_gradients() is None


def test_gemini_releases_parameters_only_above_its_keep_gathered_size():
    assert not releases_parameters(gemini_model(0, True, True))
    assert releases_parameters(gemini_model(0, True, False))
    assert not releases_parameters(nn.Linear(2, 2))


def backend_with_guard(guard_model, options):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    backend = TrainingBackend.around(model, torch.optim.SGD(model.parameters(), lr=0.1), name="policy")
    backend.gemini_guard = GeminiStepGuard(guard_model, options, "policy")  # what _wrap sets under Gemini
    return backend, model


def loss_of(model):
    return model(torch.ones(2, 4)).pow(2).mean()


def test_the_backend_refuses_a_second_backward_and_steps_after_one(monkeypatch):
    def no_weight_read(*args, **kwargs):
        raise AssertionError("a Gemini model's weights were read after the step")

    monkeypatch.setattr(booster_backend, "check_weights", no_weight_read)
    backend, model = backend_with_guard(gemini_model(), {"precision": "bf16"})
    before = model.weight.detach().clone()
    backend.backward(loss_of(model))
    with pytest.raises(GradientAccumulationError, match="second backward of the policy"):
        backend.backward(loss_of(model))
    backend.step()
    backend.zero_grad()
    assert not torch.equal(model.weight, before)
    backend.backward(loss_of(model))  # the count starts again after the step
    backend.step()


def test_the_backend_refuses_a_step_on_gradients_gemini_found_non_finite():
    guard_model = gemini_model()
    backend, model = backend_with_guard(guard_model, {"precision": "bf16"})
    backend.backward(loss_of(model))
    guard_model.chunk_manager.overflow_counter += 1
    before = model.weight.detach().clone()
    with pytest.raises(NonFiniteTrainingError, match="Gemini's gradient chunks.*not applied"):
        backend.step()
    assert torch.equal(model.weight, before)


def fp16_mixin(optimizer, overflow: bool, scale: float, min_scale: float = 1.0):
    """Stands for what GeminiOptimizer's fp16 mixin holds after its step: the ranks' overflow verdict and the loss
    scaler (colossalai 0.5's ``found_overflow``, ``grad_scaler.scale`` and ``grad_scaler._min_scale``)."""
    optimizer.mix_precision_mixin = SimpleNamespace(
        found_overflow=torch.tensor([float(overflow)]),
        grad_scaler=SimpleNamespace(scale=torch.tensor([scale]), _min_scale=torch.tensor([min_scale])))


def test_fp16_skips_are_logged_and_a_skip_at_the_smallest_loss_scale_stops_the_run(caplog):
    """Gemini skips an fp16 step whose gradients overflowed and halves its loss scale; at its minimum every later
    step is skipped too, and the run would train nothing without a word."""
    backend, model = backend_with_guard(gemini_model(), {"precision": "fp16"})
    for i, scale in enumerate([2.0 ** 15, 2.0 ** 14, 2.0 ** 13, 2.0 ** 12]):
        fp16_mixin(backend.optimizer, overflow=True, scale=scale)
        backend.backward(loss_of(model))
        with caplog.at_level("INFO", logger=finite_checks.__name__):
            backend.step()
        backend.zero_grad()
    assert backend.gemini_guard.skipped_in_a_row == 4
    assert [r.levelname for r in caplog.records if "skipped the step" in r.message] == ["INFO"] * 3 + ["WARNING"]
    fp16_mixin(backend.optimizer, overflow=False, scale=2.0 ** 12)
    backend.backward(loss_of(model))
    backend.step()
    assert backend.gemini_guard.skipped_in_a_row == 0
    backend.zero_grad()
    fp16_mixin(backend.optimizer, overflow=True, scale=1.0)
    backend.backward(loss_of(model))
    with pytest.raises(NonFiniteTrainingError, match="smallest loss scale.*trains nothing.*bf16"):
        backend.step()


def test_a_backend_that_gemini_holds_gets_the_guard_and_the_alias_hook(monkeypatch):
    """The wiring of `TrainingBackend._wrap` (here over the ddp plugin, flagged as Gemini-held)."""
    monkeypatch.setattr(TrainingBackend, "shards_parameters", property(lambda self: self.booster is not None))
    model = tied_gpt2(0)
    backend = TrainingBackend.around(model, torch.optim.SGD(model.parameters(), lr=0.1), plugin="ddp",
                                     name="policy")
    assert isinstance(backend.gemini_guard, GeminiStepGuard) and not backend.gemini_guard.accumulates
    assert len(backend.model._load_state_dict_pre_hooks) == 1
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    backend.backward(backend.model(input_ids=ids, labels=ids).loss)
    with pytest.raises(GradientAccumulationError):
        backend.backward(backend.model(input_ids=ids, labels=ids).loss)
