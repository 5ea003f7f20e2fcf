"""Run checkpoints of real TrainingBackends: what a load restores, resuming, and the error cases."""
from __future__ import annotations

import json

import pytest
import torch

from coati_relay.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm
from coati_relay.training.critic import CriticModel


def _backend(path) -> TrainingBackend:
    return TrainingBackend(load_causal_lm(path), lr=2e-3, scheduler="cosine", warmup_steps=1, total_steps=8,
                           max_grad_norm=1.0)


def _batch(step: int) -> torch.Tensor:
    return torch.randint(2, 300, (4, 16), generator=torch.Generator().manual_seed(step))


def _train(backend: TrainingBackend, steps: range) -> list:
    losses = []
    for step in steps:
        ids = _batch(step)
        loss = backend.model(input_ids=ids, labels=ids).loss
        backend.backward(loss)
        backend.step()
        backend.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _adam_state(backend: TrainingBackend) -> list:
    return [backend.optimizer.unwrap().state[p] for p in backend.unwrapped().parameters()]


def test_save_then_load_restores_model_optimizer_scheduler_and_state(tiny_model_path, tmp_path):
    trained = _backend(tiny_model_path)
    _train(trained, range(3))
    state = {"sampler": {"epoch": 1, "position": 12}, "weight_version": 3}
    step_dir = save_checkpoint(tmp_path, 3, {"actor": trained}, state)
    assert step_dir == tmp_path / "checkpoints" / "step-000003"
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-000003"
    assert list_checkpoints(tmp_path) == [step_dir]

    fresh = _backend(tiny_model_path)
    loaded = load_checkpoint(tmp_path, {"actor": fresh})
    assert loaded == {**state, "step": 3}
    want, got = trained.unwrapped().state_dict(), fresh.unwrapped().state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
    for a, b in zip(_adam_state(trained), _adam_state(fresh)):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
        assert float(a["step"]) == float(b["step"]) == 3
    assert fresh.scheduler.last_epoch == trained.scheduler.last_epoch == 3
    assert fresh.optimizer.param_groups[0]["lr"] == pytest.approx(trained.optimizer.param_groups[0]["lr"])


def test_resume_continues_like_an_uninterrupted_run(tiny_model_path, tmp_path):
    uninterrupted = _train(_backend(tiny_model_path), range(6))
    first = _backend(tiny_model_path)
    head = _train(first, range(3))
    save_checkpoint(tmp_path, 3, {"actor": first}, {})
    resumed = _backend(tiny_model_path)
    start = load_checkpoint(tmp_path / "checkpoints" / "step-000003", {"actor": resumed})["step"]
    tail = _train(resumed, range(start, 6))
    assert head == uninterrupted[:3]
    assert tail == pytest.approx(uninterrupted[3:], rel=0, abs=1e-6)


def test_two_backends_latest_and_overwrite(tiny_model_path, tmp_path):
    actor = _backend(tiny_model_path)
    critic = TrainingBackend(CriticModel.from_pretrained(tiny_model_path), lr=1e-3)
    save_checkpoint(tmp_path, 1, {"actor": actor, "critic": critic}, {"note": "first"})
    save_checkpoint(tmp_path, 2, {"actor": actor, "critic": critic}, {"note": "second"})
    save_checkpoint(tmp_path, 2, {"actor": actor, "critic": critic}, {"note": "again"})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000001", "step-000002"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step-000001", "step-000002"]
    assert load_checkpoint(tmp_path, {"actor": actor, "critic": critic})["note"] == "again"
    # A dangling pointer falls back to the newest complete checkpoint.
    (tmp_path / "checkpoints" / "latest").write_text("step-000009")
    assert load_checkpoint(tmp_path, {"critic": critic})["step"] == 2


def test_errors(tiny_model_path, tmp_path):
    backend = _backend(tiny_model_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nothing", {"actor": backend})
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        load_checkpoint(tmp_path, {"actor": backend})
    with pytest.raises(TypeError, match="JSON values"):
        save_checkpoint(tmp_path, 1, {"actor": backend}, {"tensor": torch.zeros(1)})
    with pytest.raises(ValueError, match="plain directory name"):
        save_checkpoint(tmp_path, 1, {"../x": backend}, {})
    with pytest.raises(ValueError, match="step must be an int"):
        save_checkpoint(tmp_path, -1, {"actor": backend}, {})
    assert list_checkpoints(tmp_path) == []

    step_dir = save_checkpoint(tmp_path, 1, {"actor": backend}, {})
    with pytest.raises(ValueError, match=r"has no \['critic'\]; it holds \['actor'\]"):
        load_checkpoint(step_dir, {"critic": backend})
    (step_dir / "actor" / "optimizer.pt").write_bytes(b"truncated")
    with pytest.raises(ValueError, match="could not be loaded"):
        load_checkpoint(step_dir, {"actor": backend})
    (step_dir / "actor" / "optimizer.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks \['optimizer.pt'\]"):
        load_checkpoint(step_dir, {"actor": backend})
    (step_dir / "state.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        load_checkpoint(step_dir, {"actor": backend})
    (step_dir / "state.json").write_text(json.dumps({"no_step": 1}))
    with pytest.raises(ValueError, match="no integer 'step'"):
        load_checkpoint(step_dir, {"actor": backend})
