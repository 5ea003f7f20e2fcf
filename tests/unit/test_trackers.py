"""`coati_relay.observe.trackers`: ``report_to`` checks, the fail-safe front over the trackers, and the metrics logger
feeding them every step."""
from __future__ import annotations

import json
import logging
import math
import sys

import pytest

from coati_relay.config.report_to import check_report_to
from coati_relay.observe.metrics import MetricsLogger
from coati_relay.observe.trackers import Trackers, open_trackers, plain


class Recorder:
    """A tracker that keeps what it is given; ``fail_at`` makes its log raise at that step."""

    fix = "do the recorder's fix"

    def __init__(self, name="recorder", fail_at=None):
        self.name, self.fail_at = name, fail_at
        self.where = f"{name}'s files"
        self.steps, self.configs, self.closed = [], [], 0

    def log(self, step, metrics):
        if step == self.fail_at:
            raise OSError(28, "No space left on device")
        self.steps.append((step, dict(metrics)))

    def log_config(self, config):
        self.configs.append(config)

    def close(self):
        self.closed += 1


@pytest.mark.parametrize("given,expected", [
    (None, ()), ("none", ()), ([], ()), (["none"], ()), ("wandb", ("wandb",)),
    (["tensorboard", "wandb"], ("tensorboard", "wandb")), (("wandb", "wandb"), ("wandb",)),
])
def test_report_to_forms(given, expected):
    assert check_report_to(given) == expected


@pytest.mark.parametrize("given,words", [
    (["tensorboard", "mlflow"], ["unknown tracker(s) ['mlflow']", "['tensorboard', 'wandb', 'none']"]),
    ("TensorBoard", ["['TensorBoard']", "['tensorboard', 'wandb', 'none']"]),
    (["none", "wandb"], ["'none' alone"]),
    (3, ["a tracker name or a list", "['tensorboard', 'wandb', 'none']"]),
    ([["wandb"]], ["a tracker name or a list"]),
])
def test_bad_report_to_names_the_allowed_values(given, words):
    with pytest.raises(ValueError) as err:
        check_report_to(given)
    for w in words:
        assert w in str(err.value), f"{w!r} not in {err.value}"


def test_a_failing_tracker_warns_once_and_is_switched_off(caplog):
    good, bad = Recorder("good"), Recorder("bad", fail_at=2)
    trackers = Trackers([bad, good])
    with caplog.at_level(logging.WARNING, logger="coati_relay.observe.trackers"):
        for step in (1, 2, 3, 4):
            trackers.log(step, {"reward": float(step)})
        trackers.close()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "'bad'" in warned[0] and "step 2" in warned[0] and "No space left" in warned[0]
    assert "Fix: do the recorder's fix" in warned[0]
    assert [s for s, _ in bad.steps] == [1] and bad.closed == 1, "switched off and closed at its failure"
    assert [s for s, _ in good.steps] == [1, 2, 3, 4] and good.closed == 1


def test_metrics_logger_feeds_every_metric_at_its_step_and_keeps_the_file_when_a_tracker_fails(tmp_path):
    good, bad = Recorder("good"), Recorder("bad", fail_at=1)
    logger = MetricsLogger(tmp_path, trackers=Trackers([good, bad]))
    logger.log(1, {"reward": 0.5, "loss": float("inf"), "samples": 32})
    logger.log(2, {"reward": 0.75, "kl": 0.125})
    logger.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2], "the failing tracker cost no line of the file"
    assert [s for s, _ in good.steps] == [1, 2]
    first = good.steps[0][1]
    assert first.keys() == {"reward", "loss", "samples"} and first["reward"] == 0.5 and math.isnan(first["loss"])
    assert good.steps[1][1] == {"reward": 0.75, "kl": 0.125}
    assert good.closed == 1


def test_a_tracker_that_cannot_start_is_left_out_with_the_install_fix(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with caplog.at_level(logging.WARNING, logger="coati_relay.observe.trackers"):
        trackers = open_trackers(["wandb"], tmp_path, "p", {"seed": 1})
    assert not trackers
    message, = [r.getMessage() for r in caplog.records]
    assert "report_to 'wandb'" in message and "Fix: pip install wandb" in message


def test_config_values_become_json():
    from dataclasses import dataclass
    from pathlib import Path

    @dataclass
    class Section:
        path: Path
        sizes: tuple

    def reward(x):
        return x

    config = plain({"section": Section(Path("a/b"), (1, 2)), "reward": reward, "inf": math.inf, "none": None})
    assert json.loads(json.dumps(config)) == {"section": {"path": "a/b", "sizes": [1, 2]},
                                              "reward": "test_config_values_become_json.<locals>.reward",
                                              "inf": "inf", "none": None}


def test_the_run_summary_names_where_each_tracker_wrote(tmp_path):
    from coati_relay.observe.run_result import RunResult

    trackers = open_trackers(["tensorboard"], tmp_path, "p")
    trackers.close()
    where = trackers.where["tensorboard"]
    assert where == f"{tmp_path / 'tensorboard'} (tensorboard --logdir {tmp_path / 'tensorboard'})"
    assert Trackers([Recorder("a"), Recorder("b")]).where == {"a": "a's files", "b": "b's files"}
    report = RunResult([], [], tmp_path, {}, {}, trackers=trackers.where).report()
    assert report.splitlines()[-1].split() == ["tensorboard", str(tmp_path / "tensorboard"), "(tensorboard",
                                               "--logdir", f"{tmp_path / 'tensorboard'})"]
