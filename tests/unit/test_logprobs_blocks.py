"""`coati_relay.roles.logprobs.chosen_logprobs`, the blocked log-softmax of the chosen tokens: the same values and
gradients as the one-shot ``log_softmax(logits).gather(targets)``, for every way of cutting the vocabulary rows into
blocks, and through `response_logprobs` on a real model."""
from __future__ import annotations

import pytest
import torch

from coati_relay.roles import logprobs as logprobs_module
from coati_relay.roles.logprobs import chosen_logprobs, response_logprobs


def _one_shot(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """The expression `response_logprobs` used before blocks: [N, R]."""
    r = targets.size(1)
    x = logits[:, -(r + 1):-1].float() / temperature
    return torch.log_softmax(x, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _case(n=3, k=6, v=50, r=5, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(n, k, v, generator=gen)).to(dtype)
    targets = torch.randint(0, v, (n, r), generator=gen)
    weights = torch.randn(n, r, generator=gen)
    return logits, targets, weights


def _value_and_grad(fn, logits, targets, weights, temperature):
    x = logits.detach().clone().requires_grad_(True)
    out = fn(x, targets, temperature)
    (out * weights).sum().backward()
    return out.detach(), x.grad


# BLOCK_ELEMENTS for v=50, r=5: the default -> one block, 1000 -> 4 rows a block, 250 -> one row,
# 100 -> two positions of one row, 7 -> one position.
@pytest.mark.parametrize("block", [logprobs_module.BLOCK_ELEMENTS, 1000, 250, 100, 7])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_blocks_give_the_one_shot_values_and_gradients(block, temperature, monkeypatch):
    monkeypatch.setattr(logprobs_module, "BLOCK_ELEMENTS", block)
    logits, targets, weights = _case()
    want, want_grad = _value_and_grad(_one_shot, logits, targets, weights, temperature)
    got, got_grad = _value_and_grad(chosen_logprobs, logits, targets, weights, temperature)
    assert got.dtype == torch.float32 and got.shape == (3, 5)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    assert not got_grad[:, -1].any(), "the last position predicts no response token"


def test_low_precision_logits_are_taken_in_float32_and_get_a_gradient_of_their_dtype(monkeypatch):
    monkeypatch.setattr(logprobs_module, "BLOCK_ELEMENTS", 100)
    logits, targets, weights = _case(dtype=torch.bfloat16)
    want, want_grad = _value_and_grad(_one_shot, logits, targets, weights, 1.0)
    got, got_grad = _value_and_grad(chosen_logprobs, logits, targets, weights, 1.0)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert got_grad.dtype == torch.bfloat16
    torch.testing.assert_close(got_grad, want_grad)


def test_positions_before_the_response_are_skipped():
    """Logits of the whole sequence (a model without ``logits_to_keep``): only the K-R-1 .. K-2 positions count."""
    logits, targets, weights = _case(k=9)
    got, grad = _value_and_grad(chosen_logprobs, logits, targets, weights, 1.0)
    torch.testing.assert_close(got, _one_shot(logits, targets, 1.0), rtol=1e-6, atol=0)
    assert not grad[:, :3].any() and grad[:, 3:8].abs().sum(dim=-1).gt(0).all()


@pytest.mark.parametrize("k", [6, 9])
def test_owned_logits_take_the_gradient_in_place_with_the_same_values(k, monkeypatch):
    """``own_logits``: the backward writes over the logits (an intermediate of the caller's, here ``x * 1``), zero
    outside the response positions, equal to the gradient of a new tensor."""
    monkeypatch.setattr(logprobs_module, "BLOCK_ELEMENTS", 100)
    logits, targets, weights = _case(k=k)
    _, want = _value_and_grad(chosen_logprobs, logits, targets, weights, 0.7)
    x = logits.detach().clone().requires_grad_(True)
    owned = x * 1
    (chosen_logprobs(owned, targets, 0.7, own_logits=True) * weights).sum().backward()
    torch.testing.assert_close(x.grad, want, rtol=0, atol=0)
    assert torch.equal(owned.detach(), x.grad), "the gradient was written over the owned logits"
    assert not x.grad[:, :k - 6].any() and not x.grad[:, -1].any()


def test_no_grad_forward_keeps_nothing():
    logits, targets, _ = _case()
    with torch.no_grad():
        out = chosen_logprobs(logits.requires_grad_(True), targets)
    assert out.grad_fn is None


def test_response_logprobs_of_a_model_equal_the_one_shot_expression(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    seq = torch.randint(3, model.config.vocab_size, (4, 12), generator=gen)
    attn = torch.ones_like(seq)
    attn[0, :3] = 0
    full = model(input_ids=seq, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits
    want = _one_shot(full, seq[:, -7:], 0.9)
    torch.testing.assert_close(response_logprobs(model, seq, attn, 7, temperature=0.9), want, rtol=1e-6, atol=1e-6)
