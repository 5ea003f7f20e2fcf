"""A tied input embedding trains with a sparse gradient of its own (`coati_relay.training.tied_embedding`): the
parameter's gradient is the same dense tensor as before, an optimizer step takes it under DDP, and an untied or a
frozen embedding is left dense."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from coati_relay.training.booster_backend import TrainingBackend
from coati_relay.training.tied_embedding import sparse_tied_embedding_gradient, tied_trainable_embedding

WORLD = 2


def _qwen2(tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _backward(model: torch.nn.Module, input_ids: torch.Tensor) -> None:
    logits = model(input_ids=input_ids, use_cache=False).logits
    torch.log_softmax(logits, -1)[:, :-1].gather(-1, input_ids[:, 1:, None]).sum().backward()


def test_the_tied_embedding_gradient_is_the_dense_one_and_the_step_takes_it():
    model = _qwen2(tied=True)
    dense = copy.deepcopy(model)
    assert dense.get_output_embeddings().weight is dense.get_input_embeddings().weight
    backend = TrainingBackend(model, lr=1e-2, plugin="ddp")
    assert model.get_input_embeddings().sparse and not dense.get_input_embeddings().sparse
    # repeated tokens: their rows of the sparse gradient are added up in the sum with the projection's gradient
    input_ids = torch.randint(0, 96, (3, 12), generator=torch.Generator().manual_seed(1))
    input_ids[:, ::3] = 7
    _backward(backend.model, input_ids)
    _backward(dense, input_ids)
    grads = dict(model.named_parameters())
    for name, p in dense.named_parameters():
        got = grads[name].grad
        assert got.layout == torch.strided, f"{name}: the optimizer must see a dense gradient"
        torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    embedding = model.get_input_embeddings().weight
    before = embedding.detach().clone()
    backend.step()
    backend.zero_grad()
    assert torch.isfinite(embedding).all() and not torch.equal(embedding, before)


@pytest.mark.parametrize("case", ["untied", "frozen"])
def test_an_untied_or_frozen_embedding_stays_dense(case):
    model = _qwen2(tied=case == "frozen")
    if case == "frozen":
        model.get_input_embeddings().weight.requires_grad_(False)
    assert tied_trainable_embedding(model) is None
    assert sparse_tied_embedding_gradient(model) is False
    TrainingBackend(model, lr=1e-2, plugin="ddp")
    assert not model.get_input_embeddings().sparse


def _inputs(rank: int) -> torch.Tensor:
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(10 + rank))
    ids[:, ::2] = 5  # a token both ranks embed
    return ids


def _ddp_rank(rank: int, port: int, out_dir: str) -> None:
    """One rank: the tied model under DDP, a backward on this rank's inputs; saves the averaged gradients."""
    from coati_relay.training.distributed import init_process_group

    torch.set_num_threads(1)
    init_process_group(rank, WORLD, "127.0.0.1", port, backend="gloo", timeout_s=60)
    model = _qwen2(tied=True)
    backend = TrainingBackend(model, lr=1e-2, plugin="ddp")
    assert model.get_input_embeddings().sparse
    _backward(backend.model, _inputs(rank))
    torch.save({name: p.grad.clone() for name, p in model.named_parameters()}, Path(out_dir) / f"rank{rank}.pt")


@pytest.mark.slow
def test_two_ddp_ranks_average_the_same_dense_gradient(tmp_path):
    """Under DDP with two ranks, the tied parameter's gradient (a dense sum of the projection's and the embedding's
    rows) is averaged like any other: each rank holds the mean of the dense gradients of the two ranks' inputs."""
    from gloo_ranks import run_ranks

    run_ranks(_ddp_rank, (str(tmp_path),), WORLD, 120)
    want = []
    for rank in range(WORLD):
        dense = _qwen2(tied=True)
        _backward(dense, _inputs(rank))
        want.append({name: p.grad for name, p in dense.named_parameters()})
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for name, grad in got.items():
            assert grad.layout == torch.strided, name
            torch.testing.assert_close(grad, (want[0][name] + want[1][name]) / 2, rtol=1e-5, atol=1e-6, msg=name)
