"""Not a pair: what CPU mode's device-argument redirect (`coati_compat.cpu_mode.redirect`) costs per torch call.

With the mode on, every torch call of the thread goes through the mode's ``__torch_function__`` in Python, whether
it names a device or not. Each group times the same work with the function mode off and on:

- a factory, 1000 calls of ``torch.zeros(4)``, and of ``torch.zeros(4, device="cuda")`` with the mode on (which
  the mode places on the CPU; with the mode off it would fail without CUDA);
- a plain op, 1000 calls of ``a + b`` on two 4-element tensors;
- a training step, forward and backward of the tiny Qwen2 (hidden 128, 2 layers) on 4 x 64 tokens: what the
  per-call cost adds up to in a model's step; ``torch_calls`` counts the calls the mode sees in one step (the
  backward's kernels run in C++ and are not among them).

The mode is pushed on the benchmark's thread directly (what CPU mode does in every thread of its processes), so the
off side runs in the same process; it asserts that no function mode is active there.
"""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from coati_compat.cpu_mode.redirect import CudaToCpu

CALLS, ROUNDS, WARMUP = 1000, 20, 2
STEP_ROUNDS, BATCH, SEQ = 20, 4, 64


@pytest.fixture(params=["off", "on"])
def mode(request):
    """``"off"`` (no function mode on this thread) or ``"on"`` (CPU mode's function mode pushed)."""
    if request.param == "off":
        assert torch._C._len_torch_function_stack() == 0, "a function mode is active: is CPU mode on?"
        yield request.param
        return
    with CudaToCpu(lambda call: None):
        yield request.param


def _calls(fn):
    def many():
        for _ in range(CALLS):
            out = fn()
        return out

    return many


def _record(benchmark, mode: str, group: str, name: str, fn, rounds: int = ROUNDS):
    benchmark.group = group
    benchmark.name = f"{name}, mode {mode}"
    out = benchmark.pedantic(fn, rounds=rounds, warmup_rounds=WARMUP)
    return out


def test_factory(benchmark, work, mode):
    out = _record(benchmark, mode, f"CPU mode: factory ({CALLS} calls)", "torch.zeros(4)",
                  _calls(lambda: torch.zeros(4)))
    work["calls"] = CALLS
    assert out.shape == (4,) and out.device.type == "cpu"


def test_factory_given_cuda(benchmark, work):
    with CudaToCpu(lambda call: None):
        out = _record(benchmark, "on", f"CPU mode: factory ({CALLS} calls)", 'torch.zeros(4, device="cuda")',
                      _calls(lambda: torch.zeros(4, device="cuda")))
    work["calls"] = CALLS
    assert out.shape == (4,) and out.device.type == "cpu"


def test_plain_op(benchmark, work, mode):
    a, b = torch.ones(4), torch.full((4,), 2.0)
    out = _record(benchmark, mode, f"CPU mode: plain op ({CALLS} calls)", "a + b", _calls(lambda: a + b))
    work["calls"] = CALLS
    assert torch.equal(out, torch.full((4,), 3.0))


class _Counting(TorchFunctionMode):
    """Counts the torch calls a function mode sees (each one is a call of the mode's ``__torch_function__``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def tiny_model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)


def test_training_step(benchmark, work, mode, tiny_model):
    ids = torch.randint(6, tiny_model.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))

    def step():
        tiny_model.zero_grad(set_to_none=True)
        loss = tiny_model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    loss = _record(benchmark, mode, f"CPU mode: training step (h128-l2, {BATCH} x {SEQ} tokens)",
                   "forward + backward", step, rounds=STEP_ROUNDS)
    work["tokens"] = BATCH * SEQ
    with _Counting() as counting:
        step()
    work["torch_calls"] = counting.calls
    assert torch.isfinite(loss) and all(p.grad is not None for p in tiny_model.parameters())
