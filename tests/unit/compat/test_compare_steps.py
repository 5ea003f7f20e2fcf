"""Per-step rows of ``coati-relay compare`` from recorded events and from an engine's metrics file; the recorders
that write those events (shim callbacks and the legacy-function wrappers); the summary of a side."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from coati_compat.compare import function_recording, recording, recording_switch
from coati_compat.compare.steps import legacy_rows, migrated_rows, read_events, summarize


def write_events(directory, pid, events):
    with open(directory / f"events-{pid}.jsonl", "w") as f:
        for event in events:
            f.write(json.dumps({"pid": pid, "role": "x", **event}) + "\n")


def experience(t, samples, reward, kl=0.0):
    return {"event": "experience", "t0": t - 0.5, "t1": t, "samples": samples, "reward_sum": reward * samples,
            "reward_sq_sum": reward * reward * samples, "kl_sum": kl * samples, "kl_sq_sum": kl * kl * samples}


def train(t, episode, actor_loss, samples=2, epoch=0):
    return {"event": "train", "episode": episode, "epoch": epoch, "t0": t - 0.2, "t1": t, "samples": samples,
            "actor_loss": actor_loss, "critic_loss": 2 * actor_loss}


def test_trainer_runs_make_a_step_per_episode_with_fifo_experience(tmp_path):
    # two makers (pids 1, 2), two trainers (pids 3, 4), 2 samples per batch, one batch per trainer per episode
    write_events(tmp_path, 1, [experience(1.0, 2, 0.1), experience(3.0, 2, 0.3), experience(5.0, 2, 0.5)])
    write_events(tmp_path, 2, [experience(1.5, 2, 0.2, kl=0.01), experience(3.5, 2, 0.4)])
    push = [{"event": "push", "episode": e, "t0": 2.0 + 2 * e, "t1": 2.1 + 2 * e} for e in range(3)]
    write_events(tmp_path, 3, [train(1.9, 0, 1.0), push[0], train(3.9, 1, 3.0), push[1], train(5.9, 2, 5.0),
                               push[2]])
    write_events(tmp_path, 4, [train(1.9, 0, 2.0), push[0], train(3.9, 1, 4.0, epoch=0),
                               train(3.95, 1, 4.0, epoch=1), push[1]])  # its third episode never ended
    rows = legacy_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2], "a step is complete once every trainer pushed"
    assert rows[0]["reward"] == pytest.approx(0.15) and rows[0]["samples"] == 4
    assert rows[0]["reward_std"] == pytest.approx(0.05)
    assert rows[0]["kl"] == pytest.approx(0.005)
    assert rows[1]["reward"] == pytest.approx(0.35) and rows[1]["samples"] == 4, "replays add no samples"
    assert rows[0]["actor_loss"] == pytest.approx(1.5) and rows[1]["actor_loss"] == pytest.approx(11 / 3)
    assert rows[0]["critic_loss"] == pytest.approx(3.0)
    assert rows[0]["step_s"] == pytest.approx(2.1 - 0.5) and rows[1]["step_s"] == pytest.approx(2.0)
    assert rows[1]["samples_per_s"] == pytest.approx(2.0) and rows[0]["push_s"] == pytest.approx(0.1)


def function_events():
    loss = [{"event": "loss", "which": w, "t": t, "value": v, "samples": 2}
            for w, t, v in (("actor", 2.0, 0.5), ("critic", 2.1, 0.7), ("actor", 4.0, 0.3), ("critic", 4.1, 0.6))]
    return [experience(1.0, 2, 0.1), experience(1.1, 2, 0.2), loss[0], loss[1], experience(3.0, 2, 0.4),
            loss[2], loss[3], experience(5.0, 2, 0.9)]


def test_own_actor_scripts_make_a_step_where_experience_follows_losses(tmp_path):
    write_events(tmp_path, 7, function_events())
    rows = legacy_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2], "the last experience has no losses: no step"
    assert rows[0]["samples"] == 4 and rows[0]["reward"] == pytest.approx(0.15)
    assert rows[0]["actor_loss"] == pytest.approx(0.5) and rows[1]["critic_loss"] == pytest.approx(0.6)
    assert rows[1]["step_s"] == pytest.approx(2.0) and rows[0]["push_s"] is None
    assert len(legacy_rows(tmp_path, finished=False)) == 2


def test_a_cut_off_line_is_skipped(tmp_path):
    write_events(tmp_path, 7, function_events()[:4])
    with open(tmp_path / "events-7.jsonl", "a") as f:
        f.write('{"event": "loss", "wh')
    assert len(read_events(tmp_path)) == 4
    assert len(legacy_rows(tmp_path, finished=False)) == 0, "a running step is not counted"


def test_migrated_rows_read_the_engine_metrics(tmp_path):
    assert migrated_rows(tmp_path) == []
    lines = [{"step": 1, "time": 1.0, "reward": 0.2, "kl": 0.0, "loss": 0.1, "value_loss": None, "samples": 4.0,
              "round_s": 2.0, "samples_per_s": 2.0, "weight_sync_s": 0.05}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (row,) = migrated_rows(tmp_path)
    assert row == {"step": 1, "reward": 0.2, "reward_std": None, "kl": 0.0, "actor_loss": 0.1, "critic_loss": None,
                   "samples": 4, "step_s": 2.0, "samples_per_s": 2.0, "push_s": 0.05}


def test_summary_leaves_the_warm_up_step_out_of_the_rates():
    rows = [{"step": t, "reward": 0.1 * t, "samples": 4, "step_s": 10.0 if t == 1 else 2.0, "push_s": 0.1}
            for t in range(1, 5)]
    s = summarize(rows, wall_s=40.0, peak_memory_mib=1000.0)
    assert s["steps"] == 4 and s["s_per_step"] == pytest.approx(2.0) and s["samples_per_s"] == pytest.approx(2.0)
    assert s["final_reward"] == pytest.approx(0.4) and s["reward_slope"] == pytest.approx(0.1)
    assert s["whole_run_s"] == 40.0 and s["peak_memory"] == 1000.0 and s["push_s"] == pytest.approx(0.1)
    assert summarize([], 5.0, 0.0)["final_reward"] is None


def test_recorders_are_off_without_the_variable(monkeypatch):
    monkeypatch.delenv(recording_switch.ENV, raising=False)
    assert recording.trainer_callbacks() == [] and recording.maker_callbacks(object()) == []
    assert function_recording.install() is False


def test_shim_recorders_write_train_push_and_experience_events(tmp_path, monkeypatch):
    monkeypatch.setenv(recording_switch.ENV, str(tmp_path))
    (trainer,) = recording.trainer_callbacks()
    trainer.on_episode_start(0)
    trainer.on_epoch_start(0)
    trainer.on_batch_start()
    trainer.on_batch_end({"actor_loss": torch.tensor(0.5), "critic_loss": 0.25, "note": "text"},
                         SimpleNamespace(sequences=torch.zeros(3, 5)))
    trainer.on_update_start()
    trainer.on_update_end()

    reward_model, initial_model = torch.nn.Identity(), torch.nn.Identity()
    (maker,) = recording.maker_callbacks(SimpleNamespace(reward_model=reward_model, initial_model=initial_model))
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.5], [0.5, 0.5]]))
    maker.on_make_experience_start()
    reward_model(torch.tensor([1.0, 2.0, 3.0]))
    initial_model(torch.log(torch.full((3, 2), 0.5)))
    maker.on_make_experience_end(SimpleNamespace(sequences=torch.zeros(3, 5), action_log_probs=logp,
                                                 action_mask=torch.ones(3, 2)))
    events = {e["event"]: e for e in read_events(tmp_path)}
    assert events["train"]["actor_loss"] == 0.5 and events["train"]["samples"] == 3 and "note" not in events["train"]
    assert events["push"]["episode"] == 0 and events["push"]["t1"] >= events["push"]["t0"]
    exp = events["experience"]
    assert exp["samples"] == 3 and exp["reward_sum"] == pytest.approx(6.0)
    k3 = math.exp(math.log(0.5) - math.log(0.25)) - 1 - (math.log(0.5) - math.log(0.25))
    assert exp["kl_sum"] == pytest.approx(k3 / 2, rel=1e-5)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_function_recording_wraps_the_legacy_functions(tmp_path, monkeypatch):
    from coati_compat.legacy import losses, rl_functions

    originals = (rl_functions.compute_reward, losses.PolicyLoss.forward, losses.ValueLoss.forward)
    monkeypatch.setenv(recording_switch.ENV, str(tmp_path))
    try:
        assert function_recording.install() and function_recording.install()
        r, logp = torch.tensor([1.0, 3.0]), torch.zeros(2, 4)
        shaped = rl_functions.compute_reward(r, 0.1, logp, logp, action_mask=torch.ones(2, 4))
        assert torch.equal(shaped, r)
        loss = losses.PolicyLoss()(logp, logp, torch.ones(2, 1), action_mask=torch.ones(2, 4))
        losses.ValueLoss()(torch.zeros(2), torch.zeros(2), torch.ones(2))
    finally:
        rl_functions.compute_reward, losses.PolicyLoss.forward, losses.ValueLoss.forward = originals
    events = read_events(tmp_path)
    assert [e["event"] for e in events] == ["experience", "loss", "loss"], "installed once"
    assert events[0]["reward_sum"] == 4.0 and events[0]["kl_sum"] == 0.0
    assert events[1]["which"] == "actor" and events[1]["value"] == pytest.approx(loss.item())
    assert events[2]["which"] == "critic" and events[2]["samples"] == 2


def test_a_learner_that_starts_before_another_process_made_its_experience_stays_in_the_step(tmp_path):
    """Four-role order: policy rank 0 scores and learns while rank 1 is still scoring its share of the step."""
    def loss(t, which="actor"):
        return {"event": "loss", "which": which, "t": t, "value": 1.0, "samples": 2}

    write_events(tmp_path, 1, [experience(1.0, 2, 0.1), loss(1.5), experience(3.0, 2, 0.3), loss(3.5)])
    write_events(tmp_path, 2, [experience(1.6, 2, 0.2), loss(1.8), experience(3.1, 2, 0.4), loss(3.6)])
    write_events(tmp_path, 3, [loss(1.9, "critic"), loss(3.7, "critic")])
    rows = legacy_rows(tmp_path)
    assert [(r["samples"], round(r["reward"], 6)) for r in rows] == [(4, 0.15), (4, 0.35)]


def test_the_legacy_side_adds_the_recording_hook_to_ray_init(tmp_path, monkeypatch):
    from coati_compat.compare import legacy_launch

    assert legacy_launch.with_setup_hook(None) == {"worker_process_setup_hook": legacy_launch.SETUP_HOOK}
    env = legacy_launch.with_setup_hook({"env_vars": {"A": "1"}, "worker_process_setup_hook": "os.getpid"})
    assert env["env_vars"] == {"A": "1"}
    monkeypatch.setenv(recording_switch.ENV, str(tmp_path))
    calls = []
    monkeypatch.setattr(function_recording, "install", lambda: calls.append("recording"))
    legacy_launch.with_setup_hook({"worker_process_setup_hook": lambda: calls.append("user")})[
        "worker_process_setup_hook"]()
    env["worker_process_setup_hook"]()  # the script's own hook, by name, runs after the recording one
    assert calls == ["recording", "user", "recording"]
    monkeypatch.delenv(recording_switch.ENV)
    assert legacy_launch.main(["script.py"]) == 2


def test_the_worker_hook_imports_nothing_heavy_and_wraps_on_import(tmp_path):
    """A Ray worker runs the hook before its actor's OMP_NUM_THREADS is set: torch imported there would take a thread
    per core. The hook only arranges the wrapping, which happens when the script imports the legacy functions."""
    probe = (
        "import sys\n"
        "from coati_compat.compare import function_recording\n"
        "assert function_recording.install()\n"
        "assert 'torch' not in sys.modules, 'the hook imported torch'\n"
        "from coati.models.loss import PolicyLoss\n"
        "from coati.models.utils import compute_reward\n"
        "assert getattr(PolicyLoss.forward, '_coati_compare_recorded', False)\n"
        "assert getattr(compute_reward, '_coati_compare_recorded', False)\n"
    )
    env = {**os.environ, recording_switch.ENV: str(tmp_path), "PYTHONWARNINGS": "ignore::FutureWarning"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
