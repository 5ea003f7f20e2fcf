"""Zero-bubble against lock-step, on the same work: how long each role sits idle, and the seconds per step.

- lock-step: `coati_relay.launch.launch_distributed` with ``n_behind=0`` (the producer waits for each step's
  weights, the consumer for each step's rollouts).
- zero-bubble: `coati_relay.launch_zero_bubble.launch_distributed` with its default data buffer (2 *
  train_minibatch_size * 1 = 8 prompts, one step's): the producer keeps generating while the consumer trains, and
  loads the newest weights after each of its inference batches.

Each run is a process of its own with a Ray cluster sized to the host's cores (`zero_bubble_side.py`, which lists
the work: one transformers producer and one consumer, the tiny model h128-l2, 8 prompts x 8 samples of at most 16 new
tokens per step, GRPO). The figures come from the engine's own timings, each the median over a side's runs:
``producer_idle_s_per_step`` (the producer's ``wait_s`` for weights + ``room_wait_s`` for room in the queue +
``claim_idle_s`` with nothing to claim, over the steps), ``trainer_idle_s_per_step`` (median of the consumer's
``wait_s`` for rollouts over the steps after the first) and ``s_per_step`` (median of the consumer's ``round_s``
over the steps after the first). ``make bench`` runs 3 runs of 12 steps per side; the smoke run of ``make test`` one
run of 4.

On a host with as many cores as the roles use, overlap lowers both idle times; whether it lowers s/step depends on
spare cores: on 2 shared cores the overlapped roles slow each other's compute (``train_s_per_step`` shows it).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from zero_bubble_side import GROUP, PROMPTS

HERE = Path(__file__).resolve().parent
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def setting(request, tiny_model_path, tmp_path_factory):
    """(prompts file, steps, runs per side)."""
    from coati_relay.toy import write_toy_dataset

    smoke = request.config.getoption("benchmark_disable")
    path = write_toy_dataset(tmp_path_factory.mktemp("zb") / "prompts.jsonl", num_prompts=PROMPTS)
    return str(path), (4 if smoke else 12), (1 if smoke else 3)


def run_side(entry: str, model: str, prompts: str, steps: int, out: Path):
    cmd = [sys.executable, str(HERE / "zero_bubble_side.py"), entry, "--model", model, "--prompts", prompts,
           "--steps", str(steps), "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"{entry} exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(out.read_text())


@pytest.mark.parametrize("entry", ["lock-step", "zero-bubble"])
def test_idle_time_and_step_time(benchmark, figures, tiny_model_path, setting, tmp_path, entry):
    prompts, steps, runs = setting
    benchmark.group = f"zero-bubble vs lock-step (h128-l2, {steps} steps of {PROMPTS}x{GROUP} samples)"
    per_run = []
    benchmark.pedantic(lambda: per_run.append(run_side(entry, tiny_model_path, prompts, steps,
                                                       tmp_path / f"run{len(per_run)}.json")),
                       rounds=runs, iterations=1)
    for key in per_run[0]:
        if key != "counters":
            figures[key] = statistics.median(r[key] for r in per_run)
    figures["runs"] = len(per_run)
    assert all(r["samples"] == steps * PROMPTS * GROUP for r in per_run), "both sides train on the same samples"
    if entry == "lock-step":
        assert figures["max_versions_behind"] == 0, "lock-step trains on-policy"
    else:
        assert figures["producer_weight_wait_s_per_step"] == 0.0, "zero-bubble never waits for weights"
        assert figures["max_versions_behind"] >= 1, "the producer ran ahead of the trainer"
