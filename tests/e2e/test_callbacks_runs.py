"""Whole short runs with `callbacks`, colocated and disaggregated: the hooks see every round with the numbers of
metrics.jsonl, `StopRun` ends the run at its step with a checkpoint there, a raising hook ends it naming the hook."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import run_actors, run_kwargs

from coati_relay import CallbackError, StopRun, launch_distributed

pytestmark = pytest.mark.slow
PLACEMENTS = ["colocated", "disaggregated"]


def _kwargs(request, placement, model, data, run_dir, rounds, **over):
    if placement == "disaggregated":
        request.getfixturevalue("ray_cluster")
    return run_kwargs(model, data, run_dir, backend="transformers", rounds=rounds, num_producers=1,
                      num_consumer_procs=1, inference_batch_size=8, train_batch_size=8,
                      colocate=placement == "colocated", **over)


def _lines(run_dir: Path):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Recorder:
    def __init__(self, stop_at=None):
        self.stop_at, self.calls, self.rounds, self.checkpoints = stop_at, [], [], []

    def on_run_start(self, config):
        self.calls.append("start")

    def on_round_end(self, step, metrics):
        self.calls.append("round")
        self.rounds.append((step, dict(metrics)))
        if step == self.stop_at:
            raise StopRun

    def on_checkpoint(self, step, path):
        self.checkpoints.append((step, path))

    def on_evaluate(self, step, results):
        self.calls.append("evaluate")

    def on_run_end(self, result):
        self.calls.append(("end", result.stopped_early))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_hooks_see_every_round_with_the_numbers_of_metrics_jsonl(request, placement, tiny_model_path, data,
                                                                 tmp_path):
    rec, second = Recorder(), Recorder()
    result = launch_distributed(**_kwargs(request, placement, tiny_model_path, data, tmp_path, rounds=3,
                                          save_interval=2, callbacks=[rec, second]))
    lines = _lines(tmp_path)
    assert [s for s, _ in rec.rounds] == [1, 2, 3] == [line["step"] for line in lines]
    assert [m for _, m in rec.rounds] == lines, "the hook's dicts are the lines of metrics.jsonl"
    assert second.rounds == rec.rounds
    assert rec.calls == ["start", "round", "round", "round", ("end", False)], "no evaluation: no on_evaluate"
    # one-round episodes: ColossalChat's cadence saves at each episode's end
    assert [s for s, _ in rec.checkpoints] == [1, 2, 3] and [p for _, p in rec.checkpoints] == result.checkpoints
    assert not result.stopped_early and result.stopped_at is None


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_stop_run_ends_the_run_at_its_step_with_a_checkpoint(request, placement, tiny_model_path, data, tmp_path):
    rec = Recorder(stop_at=2)
    result = launch_distributed(**_kwargs(request, placement, tiny_model_path, data, tmp_path, rounds=4,
                                          callbacks=[rec]))
    assert result.stopped_early and result.stopped_at == 2
    assert [h["step"] for h in result.history] == [1, 2] == [line["step"] for line in _lines(tmp_path)]
    ckpt = tmp_path / "checkpoints" / "step-000002"
    assert result.checkpoints[-1] == str(ckpt) and (ckpt / "state.json").is_file()
    assert json.loads((ckpt / "state.json").read_text())["step"] == 2
    assert rec.checkpoints[-1] == (2, str(ckpt)) and rec.calls[-1] == ("end", True)
    if placement == "disaggregated":
        assert run_actors(request.getfixturevalue("ray_cluster")) == []


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_raising_hook_ends_the_run_naming_it(request, placement, tiny_model_path, data, tmp_path):
    class Exploding:
        def on_round_end(self, step, metrics):
            raise ValueError(f"no good at step {step}")

    with pytest.raises(CallbackError, match=r"Exploding\.on_round_end raised ValueError: no good at step 1"):
        launch_distributed(**_kwargs(request, placement, tiny_model_path, data, tmp_path, rounds=3,
                                     callbacks=[Exploding()]))
    assert [line["step"] for line in _lines(tmp_path)] == [1]
    if placement == "disaggregated":
        assert run_actors(request.getfixturevalue("ray_cluster")) == []
