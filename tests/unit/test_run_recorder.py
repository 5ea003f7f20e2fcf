"""`RunRecorder`, the one place both placements send their rounds: history, metrics log, progress line, hooks (in
that order), evaluations, and the `RunResult` made from them."""
from __future__ import annotations

from small_run import small_run_kwargs

from coati_relay.callbacks import Hooks, StopRun
from coati_relay.config.build import build_run_config
from coati_relay.observe.evaluation import eval_metrics
from coati_relay.observe.metrics import read_metrics
from coati_relay.observe.recorder import RunRecorder


class Calls:
    """Records every hook call; stops the run at step 2."""

    def __init__(self):
        self.calls = []

    def on_round_end(self, step, record):
        self.calls.append(("round_end", step, record["reward"]))
        if step == 2:
            raise StopRun()

    def on_checkpoint(self, step, path):
        self.calls.append(("checkpoint", step, path))

    def on_evaluate(self, step, results):
        self.calls.append(("evaluate", step, results["eval/task"]))


def test_rounds_and_evaluations_reach_the_log_the_line_and_the_hooks(tmp_path, tiny_model_path, capsys):
    cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path))
    calls = Calls()
    recorder = RunRecorder(cfg, 0, Hooks([calls]))
    recorder.evaluated(0, eval_metrics(0, {"task": (1.0, 4)}))
    assert recorder.round_end({"step": 1, "reward": 0.5, "loss": 0.1, "note": "kept in the history only"}) is False
    assert recorder.round_end({"step": 2, "reward": 0.75, "checkpoint": "ckpt/step_2"}) is True
    recorder.close()

    assert calls.calls == [("evaluate", 0, 0.25), ("round_end", 1, 0.5), ("round_end", 2, 0.75),
                           ("checkpoint", 2, "ckpt/step_2")]
    logged = read_metrics(cfg.checkpointing.run_dir)
    assert [(r["step"], r.get("reward")) for r in logged] == [(0, None), (1, 0.5), (2, 0.75)]
    assert "note" not in logged[1] and recorder.history[0]["note"] == "kept in the history only"
    assert [line.split(": ")[1].split()[0:2] for line in capsys.readouterr().err.splitlines()] == \
        [["step", "1/2"], ["step", "2/2"]]

    result = recorder.result(setup_s=1.5, wall_s=3.0, counters={"produced": 2})
    assert result.checkpoints == ["ckpt/step_2"] and result.counters == {"produced": 2}
    assert result.stopped_early and result.stopped_at == 2
    assert (result.summary["steps"], result.summary["setup_s"], result.summary["wall_s"]) == (2, 1.5, 3.0)
    assert result.summary["reward_start"] == result.summary["reward_end"] == 0.625  # the evaluation left out
