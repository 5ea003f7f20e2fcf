"""Ctrl-C or SIGTERM during a run: the first signal finishes the colocated round and saves, a second stops at once,
and either way one message names the step, the latest checkpoint and the ``resume_from`` that continues the run."""
from __future__ import annotations

import os
import signal

import pytest

from coati_relay.checkpoint import save_checkpoint
from coati_relay.cli import main
from coati_relay.observe.interrupt import RunInterrupted, StopOnSignal, interrupted
from tests.unit.small_run import small_run_kwargs


def test_the_message_names_step_checkpoint_and_resume(tmp_path):
    run_dir = tmp_path / "run"
    assert str(interrupted(run_dir, run_dir)) == ("stopped before its first step; latest checkpoint: none (the run "
                                                  "starts afresh when run again)")
    (run_dir).mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "reward": 0.1}\n{"step": 2, "reward": 0.2}\n')
    assert str(interrupted(run_dir, run_dir)).startswith("stopped at step 2; latest checkpoint: none")
    written = save_checkpoint(run_dir, 3, {}, {"round": 3})  # consumers saved a step the driver did not log yet
    exc = interrupted(run_dir, run_dir)
    assert isinstance(exc, KeyboardInterrupt) and (exc.step, exc.checkpoint, exc.resume_from) == (3, written, run_dir)
    assert str(exc) == f"stopped at step 3; latest checkpoint {written}; resume with resume_from={run_dir}"


def test_first_signal_asks_the_second_stops_and_the_handlers_come_back(caplog):
    before = signal.getsignal(signal.SIGINT)
    stop = StopOnSignal("finishing this round").install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested
        assert "SIGTERM received: finishing this round, then stopping (again to stop at once)" in caplog.text
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_cli_prints_one_line_and_exits_130(tmp_path, tiny_model_path, capsys, monkeypatch):
    import yaml

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(small_run_kwargs(tmp_path, tiny_model_path)))

    def stopped(**kwargs):
        raise RunInterrupted(4, tmp_path / "run/checkpoints/step-000004", tmp_path / "run")

    monkeypatch.setattr("coati_relay.launch.launch_distributed", stopped)
    assert main(["run", str(config)]) == 130
    err = capsys.readouterr().err.strip()
    assert err == (f"coati-relay run: stopped at step 4; latest checkpoint {tmp_path}/run/checkpoints/step-000004; "
                   f"resume with resume_from={tmp_path}/run (coati-relay run {config} --set "
                   f"resume_from={tmp_path}/run)")


class _Interrupt:
    """Sends this process SIGINT at the end of round ``at``, as Ctrl-C would."""

    def __init__(self, at: int):
        self.at = at

    def on_round_end(self, step, metrics):
        if step == self.at:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
def test_colocated_run_saves_where_it_was_interrupted_and_resumes_there(tmp_path, tiny_model_path):
    from coati_relay import launch_distributed

    kw = small_run_kwargs(tmp_path, tiny_model_path, num_episodes=2, colocate=True, save_interval=100,
                          progress=False, export_dir=False, inference_model_config=None)
    with pytest.raises(RunInterrupted) as stopped:
        launch_distributed(**kw, callbacks=[_Interrupt(at=2)])
    assert stopped.value.step == 2 and stopped.value.checkpoint.name == "step-000002"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    result = launch_distributed(**{**kw, "resume_from": str(stopped.value.resume_from)})
    assert [r["step"] for r in result.history] == [3, 4]
