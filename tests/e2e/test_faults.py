"""Faults a long run meets, each with a bound on the time from the fault to the run's error (30 s): a killed
consumer, queue or weight store, a reward that raises or returns NaN, Ctrl-C, a run killed between checkpoints and
resumed. After each, the queue's counters still balance: produced == consumed + dropped + in flight."""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from run_helpers import AfterSteps, kill_actor, logged_steps, run_actors, run_kwargs

pytestmark = [pytest.mark.slow, pytest.mark.timed]

FAULT_TO_ERROR_S = 30


def small_run(model, data, run_dir, **over):
    """One producer, one consumer, transformers sampling: the cheapest run that has every role."""
    return run_kwargs(model, data, run_dir, **{"backend": "transformers", "rounds": 30, "num_producers": 1,
                                               "num_consumer_procs": 1, **over})


def balanced(c) -> bool:
    return c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"]


class AtRoundEnd:
    """A callback that runs ``action`` in the driver's ``on_round_end`` of round ``step``."""

    def __init__(self, step: int, action):
        self.step, self.action = step, action

    def on_round_end(self, step, metrics):
        if step == self.step:
            self.action()


def run_to_failure(fault, kwargs, after_steps: int = 2):
    """Starts ``fault`` once ``after_steps`` steps are logged, runs until `RunFailed`; returns (error, seconds from
    the fault to the error)."""
    from coati_relay import launch_distributed
    from coati_relay.observe.run_result import RunFailed

    trigger = AfterSteps(kwargs["run_dir"], after_steps, fault)
    trigger.start()
    try:
        launch_distributed(**kwargs)
    except RunFailed as err:
        return err, trigger.seconds_since_fired()
    fired = f"it raised {trigger.error!r}" if trigger.error else f"fired: {trigger.fired_at is not None}"
    pytest.fail(f"the run ended without RunFailed; the fault after {after_steps} steps {fired}")


@pytest.mark.parametrize("role,named", [("consumer-1", "consumer-1"), ("rollout-queue", "rollout queue actor died"),
                                        ("weight-store", "weight store actor died")])
def test_killed_actor_ends_the_run_naming_it(ray_cluster, tiny_model_path, data, tmp_path, role, named,
                                             record_property):
    kwargs = small_run(tiny_model_path, data, tmp_path / role, num_consumer_procs=2, train_batch_size=2,
                       train_minibatch_size=2, inference_microbatch_size=2)
    error, seconds = run_to_failure(kill_actor(ray_cluster, role), kwargs)
    record_property("fault_to_error_s", round(seconds, 2))
    assert named in str(error)
    assert seconds < FAULT_TO_ERROR_S, f"{role}: {seconds:.1f}s from the kill to the error"
    assert error.counters and balanced(error.counters), error.counters
    assert not run_actors(ray_cluster), "every actor of the failed run is gone"


def test_reward_returning_nan_ends_the_run_naming_reward_and_response(ray_cluster, tiny_model_path, data, tmp_path):
    from coati_relay.rewards.toy_rewards import toy_letter_reward

    calls = {"n": 0}

    def nan_on_third_call(responses, gt_answers, prompts):
        calls["n"] += 1
        scores = toy_letter_reward(responses, gt_answers, prompts)
        return scores * math.nan if calls["n"] == 3 else scores

    kwargs = small_run(tiny_model_path, data, tmp_path / "nan")
    kwargs["grpo_config"] = {**kwargs["grpo_config"], "reward_fn": nan_on_third_call}
    from coati_relay import launch_distributed
    from coati_relay.observe.run_result import RunFailed

    with pytest.raises(RunFailed, match=r"producer-0 died: ValueError: reward function .*nan_on_third_call "
                                        r"returned nan for response 0 of 16 \('.*'\) and 15 more") as err:
        launch_distributed(**kwargs)
    assert err.value.counters["consumed"] == 2 and balanced(err.value.counters)


def test_reward_that_raises_keeps_its_exception_with_a_note(ray_cluster, tiny_model_path, data, tmp_path):
    def broken(responses, gt_answers, prompts):
        raise KeyError("no such answer")

    kwargs = small_run(tiny_model_path, data, tmp_path / "raises")
    kwargs["grpo_config"] = {**kwargs["grpo_config"], "reward_fn": broken}
    from coati_relay import launch_distributed
    from coati_relay.observe.run_result import RunFailed

    with pytest.raises(RunFailed, match=r"producer-0 died: KeyError: .no such answer. \(raised by reward function "
                                        r".*broken "
                                        r"on a batch of 16 responses") as err:
        launch_distributed(**kwargs)
    assert err.value.counters["produced"] == 0 and balanced(err.value.counters)


CTRL_C_DRIVER = textwrap.dedent("""
    import logging, sys, ray
    from coati_relay import launch_distributed
    logging.basicConfig(level=logging.WARNING)
    ray.init(address=sys.argv[1], namespace="ctrl-c-driver", log_to_driver=False)
    launch_distributed(**eval(sys.argv[2]))
""")


def test_ctrl_c_stops_every_actor_and_the_run_resumes_from_its_checkpoint(ray_cluster, tiny_model_path, data, tmp_path,
                                                                         record_property):
    """A real SIGINT to a driver process: one line names the step, the latest checkpoint and the resume_from; the
    run's actors and placement group are gone within seconds; and a run resumed on the same cluster from that line's
    resume_from continues from the checkpoint's step."""
    from ray.util.placement_group import placement_group_table

    from coati_relay import launch_distributed
    from coati_relay.assembly.build import build_run_config

    kwargs = small_run(tiny_model_path, data, tmp_path / "interrupted", project_name="ctrl-c",
                       rounds=300)  # far more than can finish before the interrupt, however fast the host
    per_episode = build_run_config(**kwargs).rounds_per_episode
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen([sys.executable, "-c", CTRL_C_DRIVER, ray_cluster.get_runtime_context().gcs_address,
                               repr(kwargs)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while logged_steps(tmp_path / "interrupted") < 2 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert run_actors(ray_cluster), "the run's actors were up before the interrupt"
        interrupted_after = logged_steps(tmp_path / "interrupted")
        driver.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, stderr = driver.communicate(timeout=60)
    finally:
        driver.kill()
    summary = re.search(r"RunInterrupted: stopped at step (\d+); latest checkpoint (\S+); resume with "
                        r"resume_from=(\S+)\n", stderr)
    assert summary and "interrupted: stopping the run's 4 actors" in stderr, \
        f"exit {driver.returncode} ({interrupted_after} steps logged at the interrupt); stderr:\n{stderr[-2000:]}"
    while run_actors(ray_cluster) and time.monotonic() - t0 < FAULT_TO_ERROR_S:
        time.sleep(0.2)
    assert not run_actors(ray_cluster), f"actors left {time.monotonic() - t0:.1f}s after Ctrl-C"
    record_property("interrupt_to_no_actor_s", round(time.monotonic() - t0, 2))
    assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())
    step, checkpoint, resume_from = int(summary[1]), summary[2], summary[3]
    saved = json.loads((Path(checkpoint) / "state.json").read_text())["step"]
    assert saved <= step  # a checkpoint after each episode; the driver may log a step after its save
    resumed = launch_distributed(**{**kwargs, "num_episodes": saved // per_episode + 1, "resume_from": resume_from})
    assert [h["step"] for h in resumed.history] == list(range(saved + 1, saved + per_episode + 1))
    assert resumed.history[0]["rollout_version_min"] == saved, "producers start from the checkpoint's weights"


def test_run_killed_between_checkpoints_resumes_without_losing_a_step(ray_cluster, tiny_model_path, data, tmp_path):
    """Killed after step 5 with a checkpoint every 4 steps; resumed from the run directory, it redoes the steps after
    the checkpoint from its state: the log, the step numbers and the optimizer's step count all continue as if never
    stopped (16 rounds, one optimizer step each). The kill runs in an ``on_round_end`` hook: with one, the consumers
    wait for the driver's hooks after each round, so the kill lands mid-run however fast the host (a kill from a
    thread watching metrics.jsonl once landed after the consumer's last round, and the run ended without an error)."""
    from coati_relay import launch_distributed
    from coati_relay.checkpoint import list_checkpoints
    from coati_relay.observe.run_result import RunFailed

    run_dir, rounds = tmp_path / "run", 16
    kwargs = small_run(tiny_model_path, data, run_dir, num_episodes=rounds // 2, save_interval=4)
    with pytest.raises(RunFailed) as failed:
        launch_distributed(**kwargs, callbacks=[AtRoundEnd(5, kill_actor(ray_cluster, "consumer-0"))])
    assert "consumer-0" in str(failed.value), failed.value
    saved = json.loads((list_checkpoints(run_dir)[-1] / "state.json").read_text())
    saved_step = saved["step"]
    # two-round episodes: ColossalChat's cadence saves at each episode's end (save_interval 4 > 2 rounds)
    assert saved_step in range(2, rounds, 2), "the kill lands before the last round"
    resumed = launch_distributed(**{**kwargs, "resume_from": str(run_dir)})
    assert [h["step"] for h in resumed.history] == list(range(saved_step + 1, rounds + 1))
    assert resumed.history[0]["rollout_version_min"] == saved_step, "producers start from the checkpoint's weights"
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(1, rounds + 1)), "each step logged once"
    # the kill can land after the checkpoint and before the driver logs its step: the resumed run logs it then
    assert {k: logged[saved_step - 1][k] for k in saved["record"]} == saved["record"]
    adam = torch.load(list_checkpoints(run_dir)[-1] / "policy" / "optimizer.pt", map_location="cpu")
    steps = {int(s["step"]) for s in adam["state"].values()}
    assert steps == {rounds}, f"one optimizer step per round over {rounds} rounds, got {steps}"
    assert balanced(resumed.counters) and resumed.counters["consumed"] == rounds - saved_step
