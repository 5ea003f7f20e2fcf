"""The engine's lookup of training backends by what a caller holds, plain files for what none holds, state-dict
shards and the one seed for every random stream."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from coati_relay.roles.seeding import seed_everything
from coati_relay.training.backend_set import BackendSet
from coati_relay.training.booster_backend import TrainingBackend, unwrap_boosted
from coati_relay.training.checkpoint_files import PlainFiles
from coati_relay.training.master_weights import MasterWeightOptimizer, optimizer_chain
from coati_relay.training.state_dict_shards import state_dict_shards, sub_state_dict


def test_shards_fill_a_byte_budget_in_order():
    state = {f"w{i}": torch.zeros(10) for i in range(5)}  # 40 bytes each
    shards = list(state_dict_shards(state, 100))
    assert [list(s) for s in shards] == [["w0", "w1", "w2"], ["w3", "w4"]]
    assert list(state_dict_shards(state)) == [state]
    with pytest.raises(ValueError, match="shard_size must be a positive number of bytes"):
        next(state_dict_shards(state, 0))


def test_sub_state_dict_keeps_one_child_under_its_own_names():
    state = {"model.a": torch.ones(1), "model.b.c": torch.ones(1), "value_head.weight": torch.ones(1)}
    assert list(sub_state_dict(state, "model")) == ["a", "b.c"]


def test_backends_are_found_by_model_or_by_an_optimizer_inside_wrappers():
    model = nn.Linear(2, 2).half()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    backends = BackendSet()
    backend = backends.add(TrainingBackend.around(model, inner, plugin=None))
    assert isinstance(backend.optimizer, MasterWeightOptimizer)  # fp16 weights: fp32 masters around the optimizer
    assert optimizer_chain(backend.optimizer)[:2] == [backend.optimizer, inner]
    assert backends.find(optimizer=inner) is backend and backends.find(model=model) is backend
    assert backends.find(model=nn.Linear(2, 2)) is None
    with pytest.raises(ValueError, match="came from no TrainingBackend here"):
        backends.training(None, torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1))
    stranger = nn.Linear(3, 3)
    wrapped = backends.training(stranger, torch.optim.SGD(stranger.parameters(), lr=0.1), wrap_unknown=True)
    assert wrapped.model is stranger and backends[-1] is wrapped


def test_what_no_backend_holds_is_saved_as_plain_files(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(3, 3)
    files = BackendSet().files(model=model)
    assert isinstance(files, PlainFiles)
    files.save_model(tmp_path / "m.pt")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    files.load_model(tmp_path / "m.pt")
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert unwrap_boosted(model) is model  # nothing wraps it


def test_seed_everything_repeats_every_stream():
    def draws():
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    seed_everything(7)
    first = draws()
    seed_everything(7)
    assert draws() == first
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything("7")
