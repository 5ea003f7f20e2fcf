"""`coati-relay run CONFIG.yaml` and `coati-relay plot RUN_DIR` as a user runs them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coati_relay.toy import write_toy_dataset

pytestmark = pytest.mark.slow


def _cli(*args, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": "local"}  # a new cluster, never a stale one
    return subprocess.run([sys.executable, "-m", "coati_relay.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_run_config_file_then_plot(tiny_model_path, tmp_path):
    data = write_toy_dataset(tmp_path / "toy.jsonl", num_prompts=8)
    config = dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=3,
        inference_batch_size=8, inference_microbatch_size=8, train_batch_size=8, train_minibatch_size=8,
        train_dataset_config={"path": str(data), "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": tiny_model_path}, train_model_config={"path": tiny_model_path},
        generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0},
        grpo_config={"lr": 1e-3, "beta": 0.01, "reward_fn_type": "toy_letter"},
        plugin_config={"plugin": "ddp"}, inference_backend="transformers", num_generations=4, core_algo="GRPO",
        run_dir=str(tmp_path / "run"), save_interval=2,
    )
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    done = _cli("run", "run.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reward_end" in done.stdout and "step-000003" in done.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all("kl" in r for r in records), "beta > 0 puts the KL to the reference model in the metrics"
    plotted = _cli("plot", "run", "-o", "curve.png", cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    png = Path(tmp_path / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_bad_config_file_fails_before_any_actor(tiny_model_path, tmp_path):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({
        "num_producers": 0, "num_proc_per_producer": 1, "num_consumer_procs": 1, "num_episodes": 1,
        "inference_batch_size": 4, "inference_microbatch_size": 4, "train_batch_size": 4,
        "train_minibatch_size": 4, "train_dataset_config": {"path": "missing.jsonl"},
        "inference_model_config": {"path": tiny_model_path}, "generate_config": {}, "train_model_config": {},
        "grpo_config": {}, "plugin_config": {}}))
    done = _cli("run", "bad.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert "num_producers must be > 0" in done.stderr and "Started a local Ray" not in done.stderr
