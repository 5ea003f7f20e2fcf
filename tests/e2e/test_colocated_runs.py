"""Whole colocated runs (`launch_distributed(colocate=True)`): one process, one policy, no Ray; and the same run
disaggregated gives the same numbers."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from run_helpers import rose, run_kwargs
from tracker_files import jsonl_steps, same, tensorboard_steps

pytestmark = pytest.mark.slow


def colocated_kwargs(model, data, run_dir, algo="GRPO", rounds=12, **over):
    """The toy run of `run_kwargs` on one producer and one consumer: 8 prompts x 4 responses a round."""
    return run_kwargs(model, data, run_dir, algo, "transformers", rounds=rounds, num_producers=1,
                      num_consumer_procs=1, inference_batch_size=8, train_batch_size=8, **over)


def _policy_weights(checkpoint: str):
    return torch.load(Path(checkpoint) / "policy" / "model.pt", map_location="cpu")


@pytest.mark.parametrize("algo", ["GRPO", "PPO"])
def test_colocated_reward_rises_and_weights_stay_finite(tiny_model_path, data, tmp_path, algo):
    from transformers import AutoModelForCausalLM

    from coati_relay import launch_distributed

    result = launch_distributed(**colocated_kwargs(tiny_model_path, data, tmp_path / algo, algo, colocate=True))
    assert [h["version"] for h in result.history] == list(range(1, 13))
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "on-policy"
    assert all(h["weight_sync_s"] == 0.0 for h in result.history), "nothing is published or loaded"
    assert result.nodes == {}, "no Ray nodes: the run stays in this process"
    start, end = rose(result.history)
    assert end > start + 0.1, f"{algo}: reward did not rise: {start:.3f} -> {end:.3f}"
    assert result.counters["consumed"] == result.counters["produced"] == 12 * 2
    lines = (tmp_path / algo / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 12 and "reward" in json.loads(lines[0])
    assert result.checkpoints and result.checkpoints[-1].endswith("step-000012")
    after = _policy_weights(result.checkpoints[-1])
    before = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    assert all(bool(torch.isfinite(t).all()) for t in after.values())
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) > len(before) // 2, f"only {len(moved)} of {len(before)} tensors moved"


def test_colocated_and_disaggregated_runs_give_the_same_numbers(ray_cluster, tiny_model_path, data, tmp_path):
    """Same seed, transformers producer: the per-step rewards, losses and gradient norms and the final weights
    agree exactly. The disaggregated producer loads bit-exact copies of the weights the colocated one reads in
    place, and both draw from the same seeds. Each run's TensorBoard events (written by its driver) equal its
    metrics.jsonl."""
    from coati_relay import launch_distributed

    runs = {colocate: launch_distributed(**colocated_kwargs(tiny_model_path, data, tmp_path / str(colocate),
                                                            rounds=3, colocate=colocate, report_to=["tensorboard"]))
            for colocate in (True, False)}
    for colocate in runs:
        run_dir = tmp_path / str(colocate)
        assert same(tensorboard_steps(run_dir / "tensorboard"), jsonl_steps(run_dir)), f"colocate={colocate}"
    for key in ("reward", "loss", "grad_norm", "response_length"):
        assert [h[key] for h in runs[True].history] == [h[key] for h in runs[False].history], key
    assert runs[False].nodes, "the disaggregated run used Ray actors"
    ours, theirs = (_policy_weights(runs[c].checkpoints[-1]) for c in (True, False))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_colocated_vllm_loads_each_trained_version_in_process(tiny_model_path, data, tmp_path):
    """vLLM in the driver's process: its own copy of the weights, loaded after every round from the consumer's
    (no Ray, no serialisation); generation stays on-policy and the reward rises."""
    from coati_relay import launch_distributed

    kw = colocated_kwargs(tiny_model_path, data, tmp_path / "vllm", colocate=True)
    environment = dict(os.environ)
    result = launch_distributed(**{**kw, "inference_backend": "vllm"})
    assert dict(os.environ) == environment, "the engine's variables (LD_PRELOAD, ...) were left for later processes"
    assert result.nodes == {}, "no Ray nodes: the run stays in this process"
    assert [h["version"] for h in result.history] == list(range(1, 13))
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "on-policy"
    assert all(h["weight_sync_s"] > 0 for h in result.history), "each trained version is loaded into the engine"
    start, end = rose(result.history)
    assert end > start + 0.1, f"reward did not rise: {start:.3f} -> {end:.3f}"
    after = _policy_weights(result.checkpoints[-1])
    assert all(bool(torch.isfinite(t).all()) for t in after.values())


def test_fresh_runs_of_one_project_keep_their_own_run_dirs(tiny_model_path, data, tmp_path, monkeypatch):
    """Run twice with no run_dir, a script writes two run directories (runs/NAME, runs/NAME-2), each with its own
    steps, summary and export; naming the first as the run_dir of a third fresh run is refused before it starts."""
    from coati_relay import launch_distributed
    from coati_relay.assembly.build import ConfigError

    monkeypatch.chdir(tmp_path)
    kw = colocated_kwargs(tiny_model_path, data, None, rounds=2, colocate=True, project_name="twice",
                          export_dir=True)
    kw.pop("run_dir")
    first, second = launch_distributed(**kw), launch_distributed(**kw)
    assert (Path(first.run_dir), Path(second.run_dir)) == (Path("runs/twice"), Path("runs/twice-2"))
    for result in (first, second):
        steps = [json.loads(line)["step"] for line in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2] and result.summary["steps"] == 2
        assert (Path(result.run_dir) / "hf_model" / "config.json").is_file()
    with pytest.raises(ConfigError, match="holds an earlier run"):
        launch_distributed(**{**kw, "run_dir": "runs/twice"})
    assert not Path("runs/twice-3").exists()
