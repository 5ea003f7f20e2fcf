"""`RunRecorder`, the one place both placements send their rounds: history, metrics log, progress line, hooks (in
that order), evaluations, and the `RunResult` made from them."""
from __future__ import annotations

import json

from small_run import small_run_kwargs

from coati_relay.assembly.build import build_run_config
from coati_relay.callbacks import Hooks, StopRun
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
    recorder = RunRecorder(cfg, {"round": 0}, Hooks([calls]))
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
    assert json.loads(json.dumps(result.history)) == [{"step": 1, "reward": 0.5, "loss": 0.1,
                                                       "note": "kept in the history only"},
                                                      {"step": 2, "reward": 0.75, "checkpoint": "ckpt/step_2"}]
    assert result.stopped_early and result.stopped_at == 2
    assert (result.summary["steps"], result.summary["setup_s"], result.summary["wall_s"]) == (2, 1.5, 3.0)
    assert result.summary["reward_start"] == result.summary["reward_end"] == 0.625  # the evaluation left out


def test_a_resumed_run_logs_the_round_its_checkpoint_saved_once(tmp_path, tiny_model_path):
    """Killed after saving step 3's checkpoint and before logging step 3, a run resumed from it logs step 3 from the
    checkpoint's record; a run whose log already holds the step does not log it again, and later steps are dropped."""
    cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path))
    first = RunRecorder(cfg, {"round": 0}, Hooks([]))
    for step in (1, 2):
        first.round_end({"step": step, "reward": step / 10})
    first.close()

    saved = {"round": 3, "version": 3, "record": {"reward": 0.3, "loss": 0.05}}
    RunRecorder(cfg, saved, Hooks([])).close()
    logged = read_metrics(cfg.checkpointing.run_dir)
    assert [(r["step"], r["reward"]) for r in logged] == [(1, 0.1), (2, 0.2), (3, 0.3)] and logged[2]["loss"] == 0.05

    resumed = RunRecorder(cfg, {**saved, "round": 2, "record": {"reward": 0.9}}, Hooks([]))
    resumed.close()
    assert [(r["step"], r["reward"]) for r in read_metrics(cfg.checkpointing.run_dir)] == [(1, 0.1), (2, 0.2)]
    assert resumed.history == []
