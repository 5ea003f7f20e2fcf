"""`RunRecorder`: what the driver (`coati_relay.launch.run`) does with a run's rounds, in both placements.

Each round's record (consumer rank 0's metrics, a dict with ``step``) goes to the history, ``metrics.jsonl`` and the
trackers, the progress display and the hooks; each evaluation to the log and the hooks' ``on_evaluate``. At the end
it makes the run's `RunResult` from what it recorded.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping

from coati_relay.observe.evaluation import training_records
from coati_relay.observe.flat_rewards import FlatRewardWatch
from coati_relay.observe.metrics import MetricsLogger, ProgressBar, round_numbers, run_summary
from coati_relay.observe.round_history import RoundHistory
from coati_relay.observe.run_result import RunResult
from coati_relay.observe.trackers import open_run_trackers


class RunRecorder:
    """The records of a run (`coati_relay.config.schema.RunConfig`) resumed from the checkpoint state ``start``
    (``{"round": 0}`` for a fresh run), passed to ``hooks`` (`coati_relay.callbacks.Hooks`).

    A checkpoint holds the numbers of the round that saved it (``start["record"]``): a run killed after saving and
    before logging that round gets its line here, so every step up to the checkpoint is logged once."""

    def __init__(self, cfg: Any, start: Mapping[str, Any], hooks: Any) -> None:
        self.cfg, self.hooks = cfg, hooks
        start_round = int(start.get("round", 0))
        self.logger = MetricsLogger(cfg.checkpointing.run_dir, drop_after=start_round if start_round else None,
                                    trackers=open_run_trackers(cfg))
        if "record" in start and all(r["step"] != start_round for r in training_records(self.logger.history)):
            self.logger.log(start_round, start["record"])
        self.bar = ProgressBar.for_run(cfg, start_round)
        self.history = RoundHistory()
        self.flat_rewards = FlatRewardWatch.for_run(cfg)
        self.checkpoints: List[str] = []  # the checkpoints the recorded rounds saved, in order

    def round_end(self, record: Dict[str, Any]) -> bool:
        """Records one round; True where a hook asks the run to stop."""
        self.history.append(record)
        if "checkpoint" in record:
            self.checkpoints.append(record["checkpoint"])
        numbers = round_numbers(record)
        step = int(record["step"])
        logged = self.logger.log(step, numbers)
        self.flat_rewards.update(step, numbers)
        self.bar.update(step - 1, numbers)
        return self.hooks.round_end(step, logged, record.get("checkpoint"))

    def evaluated(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Records the evaluation run before training step ``step``."""
        self.hooks.evaluate(step, self.logger.log(step, metrics))

    def close(self) -> None:
        self.bar.close()
        self.logger.close()

    def result(self, setup_s: float, wall_s: float, **fields: Any) -> RunResult:
        """The run's `RunResult`: the recorded history (a list of dicts, as users read and serialise it; compact only
        while the run goes) and checkpoints, the summary of the logged training records
        (with ``setup_s`` and ``wall_s``, training only), and ``fields`` (counters, producer_stats, ...)."""
        summary = run_summary(training_records(self.logger.history))
        summary.update(setup_s=setup_s, wall_s=wall_s)
        fields.setdefault("checkpoints", self.checkpoints)
        fields.setdefault("trackers", dict(getattr(self.logger.trackers, "where", {})))
        return RunResult(history=list(self.history), run_dir=self.cfg.checkpointing.run_dir, summary=summary,
                         setup_s=setup_s, stopped_early=self.hooks.stop_at is not None,
                         stopped_at=self.hooks.stop_at, **fields)
