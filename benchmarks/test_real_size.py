"""Real size: TRL's ``GRPOTrainer`` against the engine's colocated GRPO on a model of Qwen2.5-0.5B's shape
(`real_size.py`, 494M parameters), one process a side (`peer_grpo.py`), in one run. ``make bench`` only: a side
takes minutes and up to about 15 GB.

Work per step, the same on both sides: 4 toy prompts x 4 samples of at most 32 new tokens, AdamW (lr 5e-3, weight
decay 0.01), constant schedule, ``beta = 0``, one optimizer step; TRL trains its 16 sequences in one micro-batch with
gradient checkpointing (its default), both in bf16 autocast (TRL's default precision); the engine in micro-batches of
4 without, at TRL's settings, and at TRL's settings in float32 (less memory, more time). The toy
reward stays 0 on this random model, so both sides do a step's whole work with zero gradients: the pair measures
cost, not learning (the toy-model pairs check learning). Figures per side: s/step (median of the steps after the
first), whole run, peak PSS of the process tree and bytes per parameter, and on the engine's side
its largest RSS in each phase (`peer_grpo.memory_by_phase`).
"""
from __future__ import annotations

import statistics
from typing import Any, Dict

import pytest
from real_size import build_real_size_model
from test_vs_trl import run_side

PROMPTS, GENERATIONS, NEW_TOKENS, MICROBATCH, STEPS = 4, 4, 32, 4, 3
WORK = ["--prompts", str(PROMPTS), "--generations", str(GENERATIONS)]
# side -> (peer_grpo.py side, its arguments); the engine three times: in micro-batches of 4, and at TRL's own
# training settings (the step's 16 samples in one micro-batch, gradient checkpointing) in bf16 and in float32
EXTRA_ARGS = {"trl": ("trl", WORK),
              "engine-colocated": ("engine-colocated", [*WORK, "--train-microbatch", str(MICROBATCH)]),
              "engine-colocated-trl-settings": ("engine-colocated", [*WORK, "--gradient-checkpointing"]),
              "engine-colocated-trl-settings-fp32": ("engine-colocated",
                                                     [*WORK, "--gradient-checkpointing", "--precision", "fp32"])}


def _parameters(model: str) -> int:
    import json
    from pathlib import Path

    from real_size import SHAPE

    config = json.loads((Path(model) / "config.json").read_text())
    assert all(config[k] == v for k, v in SHAPE.items() if k in config), config
    h, layers, v = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    per_layer = 2 * h * h + 2 * h * kv + h + 2 * kv + 3 * h * config["intermediate_size"] + 2 * h
    return v * h + layers * per_layer + h


@pytest.mark.slow
@pytest.mark.parametrize("side", list(EXTRA_ARGS))
def test_real_size_vs_trl(benchmark, figures, tmp_path, side):
    benchmark.group = "vs-trl-real-size"
    if benchmark.disabled:
        pytest.skip("make bench only: each side of the 494M model takes minutes and up to about 15 GB")
    model = str(build_real_size_model())
    runs = []
    peer_side, extra = EXTRA_ARGS[side]
    benchmark.pedantic(lambda: runs.append(run_side(peer_side, model, STEPS, tmp_path, NEW_TOKENS, extra)),
                       rounds=1, iterations=1)
    run = runs[0]
    assert len(run["steps"]) == STEPS, run["steps"]
    for step in run["steps"]:
        assert step["samples"] == PROMPTS * GENERATIONS and 0 < step["tokens"] <= PROMPTS * GENERATIONS * NEW_TOKENS
    # the toy reward is 0 on this random model (the toy tokenizer decodes few of the sampled ids), so GRPO's
    # advantages and gradients are 0 and the weights move by weight decay alone, on the tensors it applies to
    assert run["params"]["checked"] and run["params"]["finite"], run["params"]
    assert run["params"]["moved"] > 0, run["params"]
    params = _parameters(model)
    out: Dict[str, Any] = {
        "parameters": params, "s_per_step": statistics.median(s["step_s"] for s in run["steps"][1:]),
        "generate_s_per_step": statistics.median(s["generate_s"] for s in run["steps"][1:]),
        "train_s_per_step": statistics.median(s["train_s"] for s in run["steps"][1:]),
        "whole_run_s": run["whole_run_s"], "peak_pss_gib": run["peak_pss_gib"],
        "bytes_per_parameter": run["peak_pss_gib"] * 2 ** 30 / params, "load_average": run["load_average"]}
    if "memory_by_phase_mib" in run:
        out["memory_by_phase_mib"] = {k: round(v) for k, v in run["memory_by_phase_mib"].items()}
    figures.update(out)
