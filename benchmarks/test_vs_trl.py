"""The peer pair: TRL's ``GRPOTrainer`` and `launch_distributed(core_algo="GRPO")` on the same work, in one run.

Each side runs as its own process (`peer_grpo.py`): the whole-run time includes its start-up (imports, Ray, vLLM),
and the peak memory is the largest sum of the proportional set sizes (PSS) of that process and all its descendants
(Ray's GCS, raylet and workers included), sampled every 0.2 s. Work per step, the same on every side: 8 toy prompts x
8 samples of at most 12 new tokens, one optimizer step (`peer_grpo.py` lists the settings). Two model sizes: the tiny
Qwen2 (hidden 128, 2 layers, 0.38M parameters) and a small one (hidden 256, 6 layers, 3.5M parameters); and a third
setting where the step is decoding: the small model with at most 128 new tokens (`LONG_SETTING`), run by ``make bench``
only (its sides take 1-2 minutes each even for 2 steps, too long for the smoke run), without the disaggregated
transformers side and with one more: the colocated transformers side training in 4 micro-batches of 16 (the
activations of 64 sequences of 157 tokens in one backward are most of a step's peak memory).

Sides: TRL, the engine disaggregated (Ray actors) with a vLLM or a transformers producer, and the engine colocated
(``colocate=True``: one process), generating with the training model itself (transformers) or with an in-process vLLM
engine loaded after every step.

Figures per side (medians over the timed rounds; a round is one whole run): steady s/step (the steps after the
first), samples/s, whole-run time, ``outside_steps_s`` (the whole run less its steps: start-up and shut-down), peak
PSS (on CUDA also ``gpu_peak_gib``, the GPU peak of the side's process, `peer_grpo.gpu_peak`), the reward curve and
the first step whose reward reached 0.9, the FLOPs of a step's generation and training from the model's shapes
(`flops.py`), the achieved FLOP/s beside this machine's ``torch.mm`` peak measured in the same run, and the 1-minute
load average at the end of each run. ``--benchmark-disable`` (the smoke run of ``make test``) runs each side of
the tiny model once for 2 steps (the small model's sides run the same code on bigger tensors: ``make bench`` only);
``make bench`` runs 3 rounds of 20 steps per side.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest
from flops import generation_flops, matmul_peak_flops, model_shapes, training_flops
from peer_grpo import GENERATIONS, NEW_TOKENS, PROMPTS_PER_STEP, numbered_prompt

from coati_compat.compare.process_memory import MemorySampler

HERE = Path(__file__).resolve().parent
MODELS = {"0.38M": dict(hidden_size=128, num_layers=2), "3.5M": dict(hidden_size=256, num_layers=6)}
LONG_SETTING = "3.5M-128tok"
# setting -> (model, most new tokens per sample)
SETTINGS = {"0.38M": ("0.38M", NEW_TOKENS), "3.5M": ("3.5M", NEW_TOKENS), LONG_SETTING: ("3.5M", 128)}
# side -> peer_grpo.py arguments
SIDES = {"trl": ["trl"], "engine-vllm": ["engine", "--backend", "vllm"],
         "engine-transformers": ["engine", "--backend", "transformers"],
         "engine-colocated": ["engine", "--backend", "transformers", "--colocate"],
         "engine-colocated-vllm": ["engine", "--backend", "vllm", "--colocate"],
         # the long setting only: each side in training micro-batches of 16 and of 32 (one optimizer step a step)
         "engine-colocated-mb16": ["engine", "--backend", "transformers", "--colocate", "--train-microbatch", "16"],
         "engine-colocated-mb32": ["engine", "--backend", "transformers", "--colocate", "--train-microbatch", "32"],
         "trl-mb16": ["trl", "--train-microbatch", "16"], "trl-mb32": ["trl", "--train-microbatch", "32"]}
# Where a side computes each prompt once for its samples (`coati_relay.inference.prompt_sharing`): the engine's
# consumer in training, the transformers backend in its prefill.
TRAINING_SHARES = {"engine-vllm", "engine-transformers", "engine-colocated", "engine-colocated-vllm",
                   "engine-colocated-mb16", "engine-colocated-mb32"}
PREFILL_SHARES = {"engine-transformers", "engine-colocated", "engine-colocated-mb16", "engine-colocated-mb32"}
SAMPLES_PER_STEP = PROMPTS_PER_STEP * GENERATIONS
LONG_ONLY = {"engine-colocated-mb16", "engine-colocated-mb32", "trl-mb16", "trl-mb32"}
SHORT_ONLY = {"engine-transformers"}
CASES = [(setting, side) for setting in SETTINGS for side in SIDES
         if side not in (SHORT_ONLY if setting == LONG_SETTING else LONG_ONLY)]
SMOKE_SETTING = "0.38M"  # the only setting of the smoke run
STEPS_TIMED, ROUNDS_TIMED, STEPS_SMOKE = 20, 3, 2
RUN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def peak_flops() -> float:
    return matmul_peak_flops()


@pytest.fixture(scope="module")
def peer_models() -> Dict[str, str]:
    from coati_relay.toy import build_tiny_model

    return {name: str(build_tiny_model(**shape)) for name, shape in MODELS.items()}


def _side_env() -> Dict[str, str]:
    """This process's environment for a side (a group of one made here leaves none of its variables in it)."""
    return {**os.environ, "RAY_ADDRESS": "local"}


def run_side(side: str, model: str, steps: int, out_dir: Path, new_tokens: int = NEW_TOKENS,
             extra: Sequence[str] = ()) -> Dict[str, Any]:
    """Runs one side in a process of its own (``extra``: more `peer_grpo.py` arguments); returns its result file plus
    ``whole_run_s``, ``peak_pss_gib`` and ``load_average`` (the 1-minute load when it ended)."""
    out = out_dir / f"{side}.json"
    cmd = [sys.executable, str(HERE / "peer_grpo.py"), *SIDES[side], "--model", model, "--steps", str(steps),
           "--out", str(out), "--new-tokens", str(new_tokens), *extra]
    log = open(out_dir / f"{side}.log", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_side_env())
    sampler = MemorySampler(proc.pid, every_s=0.2)
    sampler.start()
    try:
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    finally:
        sampler.stop()
        log.close()
    whole = time.perf_counter() - t0
    if code != 0:
        tail = (out_dir / f"{side}.log").read_text()[-3000:]
        raise AssertionError(f"{side} exited with {code}; the end of its log:\n{tail}")
    result = json.loads(out.read_text())
    result.update(whole_run_s=whole, peak_pss_gib=sampler.total_peak_mib / 1024, load_average=os.getloadavg()[0])
    return result


def _first_step_at(rewards: List[float], level: float = 0.9) -> Optional[int]:
    return next((i + 1 for i, r in enumerate(rewards) if r >= level), None)


def _figures(runs: List[Dict[str, Any]], model: str, peak: float, side: str, new_tokens: int) -> Dict[str, Any]:
    """Medians over the rounds of one side, FLOPs per step, and achieved FLOP/s against ``peak``.

    ``gflop_generation``/``gflop_training``: the step's work as TRL does it (every sample prefills and trains its
    prompt), the same on every side; ``gflop_executed``: what this side computes (each prompt once where it shares
    them), from which the achieved FLOP/s are taken."""
    from transformers import AutoTokenizer

    from coati_relay.toy import toy_prompt_text

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": numbered_prompt(toy_prompt_text("a"), 10)}],
                                           add_generation_prompt=True, tokenize=False)
    prompt_len = len(tokenizer(prompt)["input_ids"])
    shapes = model_shapes(model)
    per_run = []
    for run in runs:
        steps = run["steps"]
        steady = steps[1:] or steps
        new_tokens_mean = statistics.mean(s["tokens"] for s in steps) / SAMPLES_PER_STEP
        gen = generation_flops(shapes, SAMPLES_PER_STEP, prompt_len, new_tokens_mean)
        train = training_flops(shapes, SAMPLES_PER_STEP, prompt_len, new_tokens_mean)
        gen_done = generation_flops(shapes, SAMPLES_PER_STEP, prompt_len, new_tokens_mean,
                                    PROMPTS_PER_STEP if side in PREFILL_SHARES else None)
        done = gen_done + training_flops(shapes, SAMPLES_PER_STEP, prompt_len, new_tokens_mean,
                                         PROMPTS_PER_STEP if side in TRAINING_SHARES else None)
        s_step = statistics.median(s["step_s"] for s in steady)
        s_gen = statistics.median(s["generate_s"] for s in steady)
        s_train = statistics.median(s["train_s"] for s in steady)
        per_run.append({"s_per_step": s_step, "generate_s_per_step": s_gen, "train_s_per_step": s_train,
                        "samples_per_s": SAMPLES_PER_STEP / s_step, "whole_run_s": run["whole_run_s"],
                        "outside_steps_s": run["whole_run_s"] - sum(s["step_s"] for s in steps),
                        "load_average": run["load_average"], "new_tokens_per_sample": new_tokens_mean,
                        "peak_pss_gib": run["peak_pss_gib"], "gflop_generation": gen / 1e9,
                        "gflop_training": train / 1e9, "gflop_executed": done / 1e9,
                        "gflop_per_s": done / s_step / 1e9,
                        "generation_gflop_per_s": gen_done / max(s_gen, 1e-9) / 1e9,
                        **({"gpu_peak_gib": run["gpu_peak_gib"]} if "gpu_peak_gib" in run else {})})
    out = {key: statistics.median(r[key] for r in per_run) for key in per_run[0]}
    out["fraction_of_matmul_peak"] = out["gflop_per_s"] * 1e9 / peak
    out["matmul_peak_gflop_per_s"] = peak / 1e9
    out["max_new_tokens"] = new_tokens
    out["rewards_first_round"] = [round(s["reward"], 3) for s in runs[0]["steps"]]
    out["first_step_reward_0.9"] = statistics.median(
        [_first_step_at([s["reward"] for s in r["steps"]]) or len(r["steps"]) + 1 for r in runs])
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("setting", "side"), CASES)
def test_grpo_vs_trl(benchmark, figures, tmp_path, peer_models, peak_flops, setting, side):
    benchmark.group = f"vs-trl-grpo-{setting}"
    if setting != SMOKE_SETTING and benchmark.disabled:
        pytest.skip(f"{setting}: make bench only (the smoke run's sides run on the {SMOKE_SETTING} model; the others "
                    f"run the same code on bigger tensors, {LONG_SETTING} for minutes per side)")
    model_name, new_tokens = SETTINGS[setting]
    model = peer_models[model_name]
    steps = STEPS_SMOKE if benchmark.disabled else STEPS_TIMED
    runs: List[Dict[str, Any]] = []

    def one_run() -> None:
        out_dir = tmp_path / f"round{len(runs)}"
        out_dir.mkdir()
        runs.append(run_side(side, model, steps, out_dir, new_tokens))

    benchmark.pedantic(one_run, rounds=1 if benchmark.disabled else ROUNDS_TIMED, iterations=1)

    for run in runs:  # the same work on every side: steps, samples, bounded tokens, a trained, finite policy
        assert len(run["steps"]) == steps, run["steps"]
        for step in run["steps"]:
            assert step["samples"] == SAMPLES_PER_STEP, step
            if side.startswith("trl"):
                assert step["trained_samples"] == SAMPLES_PER_STEP, step
            assert 0 < step["tokens"] <= SAMPLES_PER_STEP * new_tokens, step
            assert 0.0 <= step["reward"] <= 1.0, step
        assert run["params"]["checked"] and run["params"]["finite"], run["params"]
        assert run["params"]["moved"] == run["params"]["tensors"] > 0, run["params"]
    figures.update(_figures(runs, model, peak_flops, side, new_tokens))
