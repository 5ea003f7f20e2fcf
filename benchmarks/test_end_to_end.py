"""Pair 5, end to end: a legacy-API PPO run and its engine run, on the same work.

- old API, legacy loop: ``coati_compat.demo_legacy.run_legacy_ppo`` (one ``ExperienceMakerHolder``, one
  ``DetachedPPOTrainer``, the upstream wiring) with ``sampler="legacy"``: the old token-by-token sampling loop.
- old API, vLLM maker: the same run with ``sampler="vllm"``: the maker samples with a vLLM engine.
- new: ``launch_distributed(core_algo="PPO", ...)`` with the legacy run's settings, as the rewriter maps them: one
  producer (vLLM), one consumer with a critic, the same prompts (CSV), samples per step, new tokens, top-k,
  learning rate and KL coefficient.

Each side runs the same number of steps of ``BATCH`` samples, every step followed by a weight push to the sampler.
The figures are taken after the first step (start-up and warm-up excluded), on the trainer's clock (legacy: time
between the ends of two training steps; engine: the consumer's ``round_s``, from taking a round's rollouts to having
published the next weights): ``s_per_step``, ``samples_per_s`` and ``weight_sync_s_per_step`` (legacy: the
trainer's push to the maker; engine: publish plus the producer's load). ``make bench`` runs the medium model
(h512-l8, 17.6M parameters) for 8 steps; the smoke run of ``make test`` the tiny one, for 3.
"""
from __future__ import annotations

import math

import pytest

from coati_compat.demo_legacy import NEW_TOKENS, PROMPT_TOKENS  # the legacy run's prompt and response lengths

BATCH, LR, KL_COEF, TOP_K = 16, 5e-3, 0.1, 50


@pytest.fixture(scope="module")
def setting(request, tiny_model_path, medium_model_path, tmp_path_factory):
    """(model path, steps, prompts CSV, group name): the medium model for timing, the tiny one in a smoke run."""
    from coati_relay.toy import write_toy_dataset

    smoke = request.config.getoption("benchmark_disable")
    model, steps = (tiny_model_path, 3) if smoke else (medium_model_path, 8)
    path = write_toy_dataset(tmp_path_factory.mktemp("e2e") / "prompts.csv", num_prompts=BATCH, fmt="csv")
    size = "h128-l2" if smoke else "h512-l8, 17.6M parameters"
    return model, steps, str(path), f"end to end PPO ({size}, {steps} steps of {BATCH} samples)"


def _figures(records, seconds, benchmark, work) -> None:
    """Per-step figures after the first step into ``extra_info``; checks every step trained to finite losses.
    seconds: each step's duration after the first."""
    assert all(math.isfinite(r["loss"]) for r in records), [r["loss"] for r in records]
    work["steps"] = len(records)
    s_per_step = sum(seconds) / len(seconds)
    benchmark.extra_info.update({"s_per_step": s_per_step, "samples_per_s": BATCH / s_per_step,
                                 "weight_sync_s_per_step": sum(r["weight_sync_s"] for r in records[1:]) / len(seconds)})


@pytest.mark.parametrize("sampler", ["legacy", "vllm"])
def test_legacy_api_run(benchmark, work, ray_session, setting, tmp_path, sampler):
    from coati_compat.demo_legacy import run_legacy_ppo

    model, steps, prompts, benchmark.group = setting
    run = benchmark.pedantic(run_legacy_ppo, args=(model, prompts, str(tmp_path / "run")),
                             kwargs=dict(steps=steps, lr=LR, batch_size=BATCH, kl_coef=KL_COEF, sampler=sampler),
                             rounds=1, iterations=1)
    assert [r["step"] for r in run["history"]] == list(range(1, steps + 1))
    times = [r["time"] for r in run["history"]]  # the trainer's clock at the end of each step
    _figures(run["history"], [b - a for a, b in zip(times, times[1:])], benchmark, work)


@pytest.mark.parametrize("n_behind", [0, 1], ids=["lock-step", "overlapped"])
def test_migrated_engine_run(benchmark, work, ray_session, setting, tmp_path, n_behind):
    """As the rewriter writes it (``n_behind=0``: on-policy lock-step), and with generation overlapping training
    by one weight version (``n_behind=1``), as the legacy makers overlapped the trainers."""
    from coati_relay import launch_distributed

    model, steps, prompts, benchmark.group = setting
    kwargs = dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=steps,
        inference_batch_size=BATCH, inference_microbatch_size=BATCH, train_batch_size=BATCH,
        train_minibatch_size=BATCH, num_generations=1, core_algo="PPO",
        train_dataset_config={"path": prompts, "max_length": PROMPT_TOKENS},
        inference_model_config={"path": model}, train_model_config={"path": model},
        critic_model_config={"path": model},
        generate_config={"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "top_k": TOP_K, "top_p": 1.0},
        grpo_config={"lr": LR, "critic_lr": LR, "kl_coef": KL_COEF, "reward_fn_type": "toy_letter"},
        plugin_config={"plugin": "ddp"}, inference_backend="vllm", run_dir=str(tmp_path / "run"),
        save_interval=10 ** 6, progress=False, timeout_s=600, project_name="e2e-bench", n_behind=n_behind)
    result = benchmark.pedantic(launch_distributed, kwargs=kwargs, rounds=1, iterations=1)
    assert [h["step"] for h in result.history] == list(range(1, steps + 1))
    _figures(result.history, [h["round_s"] for h in result.history[1:]], benchmark, work)  # the consumer's clock
