"""``report_to``: a GRPO run's TensorBoard events and offline W&B run hold every step's metrics, value for value as in
``metrics.jsonl``; trackers that break change nothing about the run."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
from run_helpers import run_kwargs
from tracker_files import jsonl_steps, same, tensorboard_steps, wandb_records, wandb_steps

pytestmark = pytest.mark.slow


def colocated_run(model, data, run_dir, **over):
    """Three rounds of the toy GRPO task in one process (8 prompts x 4 responses a round), with a KL term."""
    from coati_relay import launch_distributed

    kw = run_kwargs(model, data, run_dir, "GRPO", "transformers", rounds=3, num_producers=1, num_consumer_procs=1,
                    inference_batch_size=8, train_batch_size=8, colocate=True, save_interval=3, **over)
    kw["grpo_config"] = {**kw["grpo_config"], "beta": 0.04}
    return launch_distributed(**kw)


def test_grpo_run_writes_tensorboard_and_offline_wandb_equal_to_the_jsonl(tiny_model_path, data, tmp_path,
                                                                           monkeypatch, caplog):
    """No W&B login here (no key, no netrc, no WANDB_MODE): the run goes offline by itself, under run_dir/wandb."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="coati_relay.observe.trackers"):
        result = colocated_run(tiny_model_path, data, run_dir, report_to=["tensorboard", "wandb"],
                               project_name="toy trackers")
    assert result.trackers == {"tensorboard": f"{run_dir / 'tensorboard'} (tensorboard --logdir "
                                              f"{run_dir / 'tensorboard'})",
                               "wandb": f"{run_dir}/wandb (offline: wandb sync {run_dir}/wandb/offline-run-*)"}
    assert "wandb sync" in result.report()
    assert not [r.getMessage() for r in caplog.records if r.name == "coati_relay.observe.trackers"], "no tracker failed"
    want = jsonl_steps(run_dir)
    assert sorted(want) == [1, 2, 3] and {"reward", "loss", "grad_norm", "kl", "response_length",
                                          "samples_per_s", "generate_s", "train_s"} <= set(want[1])
    tensorboard = tensorboard_steps(run_dir / "tensorboard")
    assert same(tensorboard, want), f"TensorBoard {tensorboard} != metrics.jsonl {want}"
    records = wandb_records(run_dir / "wandb")
    history = wandb_steps(records)
    assert same(history, want), f"W&B history {history} != metrics.jsonl {want}"
    run, = [r["run"] for r in records if r["type"] == "run"]
    assert run["project"] == "toy trackers" and run["telemetry"]["feature"]["offline"]
    configs = [r["config"]["update"] for r in records if r["type"] == "config" and "core_algo" in r["config"]["update"]]
    assert len(configs) == 1, "the run config is logged once"
    assert configs[0]["core_algo"] == "GRPO" and configs[0]["batches"]["num_generations"] == 4


def repeatable(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """What a seeded run repeats exactly: every metric but the timings (durations ``*_s``, clock times ``*_at``) and
    the checkpoint's path."""
    return {k: v for k, v in metrics.items()
            if not (k.endswith(("_s", "_at")) or k in ("samples_per_s", "checkpoint"))}


def test_broken_trackers_leave_the_run_and_its_jsonl_unchanged(tiny_model_path, data, tmp_path, monkeypatch,
                                                               caplog):
    """W&B not installed (its import fails) and a TensorBoard writer whose disk is full: each warns once, naming the
    tracker and the fix; the run trains, checkpoints and logs exactly as without trackers."""
    from coati_relay.observe import trackers
    plain = colocated_run(tiny_model_path, data, tmp_path / "plain")

    def disk_full(self, step, metrics):
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    monkeypatch.setattr(trackers.TensorBoardTracker, "log", disk_full)
    with caplog.at_level(logging.WARNING, logger="coati_relay.observe.trackers"):
        broken = colocated_run(tiny_model_path, data, tmp_path / "broken", report_to=["tensorboard", "wandb"])
    warned = [r.getMessage() for r in caplog.records if r.name == "coati_relay.observe.trackers"]
    assert len(warned) == 2, warned
    assert "'wandb'" in warned[0] and "ModuleNotFoundError" in warned[0] and "Fix: pip install wandb" in warned[0]
    assert "'tensorboard'" in warned[1] and "No space left" in warned[1] and "free space" in warned[1]
    want = {s: repeatable(m) for s, m in jsonl_steps(tmp_path / "plain").items()}
    assert same({s: repeatable(m) for s, m in jsonl_steps(tmp_path / "broken").items()}, want)
    assert same(dict(enumerate(map(repeatable, broken.history))), dict(enumerate(map(repeatable, plain.history))))
    ours, theirs = (torch.load(Path(r.checkpoints[-1]) / "policy" / "model.pt", map_location="cpu")
                    for r in (broken, plain))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
