"""Metrics JSONL, progress bar, summary table and numbers, and the PNG plot."""
from __future__ import annotations

import io
import json
import logging
import math

import pytest

from coati_relay.observe.metrics import MetricsLogger, ProgressBar, read_metrics, run_summary, summary_table
from coati_relay.observe.plotting import plot_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fill(run_dir, n=6, loss=True, reward_offset=0.0):
    logger = MetricsLogger(run_dir)
    for step in range(n):
        metrics = {"reward": reward_offset + 0.1 * step}
        if loss:
            metrics["loss"] = 1.0 / (step + 1)
        logger.log(step, metrics)
    return logger


# ---------------------------------------------------------------- JSONL


def test_jsonl_round_trip_and_non_finite_as_null(tmp_path):
    import numpy as np
    import torch

    logger = MetricsLogger(tmp_path / "run")
    logger.log(0, {"reward": 0.5, "loss": float("nan"), "kl": np.float32(0.25), "n": torch.tensor(3)})
    logger.log(1, {"reward": float("inf")})
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["step"] == 0 and first["loss"] is None and first["kl"] == 0.25 and first["n"] == 3.0
    assert isinstance(first["time"], float) and first["time"] > 1e9
    assert "NaN" not in lines[0] and "Infinity" not in lines[1]
    back = read_metrics(tmp_path / "run")
    assert [r["step"] for r in back] == [0, 1]
    assert math.isnan(back[0]["loss"]) and math.isnan(back[1]["reward"])
    assert back[0]["reward"] == 0.5 and back[0]["time"] == first["time"]
    assert len(logger.history) == 2 and math.isnan(logger.history[0]["loss"])
    assert logger.history[0]["reward"] == back[0]["reward"]


def test_logger_continues_an_existing_file(tmp_path):
    _fill(tmp_path, n=3)
    again = MetricsLogger(tmp_path)
    assert [r["step"] for r in again.history] == [0, 1, 2]
    again.log(3, {"reward": 1.0})
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
    assert read_metrics(tmp_path / "metrics.jsonl")[-1]["reward"] == 1.0


def test_resumed_logger_drops_the_steps_its_checkpoint_does_not_hold(tmp_path, caplog):
    first = MetricsLogger(tmp_path)
    for step in range(1, 6):
        first.log(step, {"reward": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "rew')  # killed while writing step 6
    with caplog.at_level(logging.WARNING, logger="coati_relay.observe.metrics"):
        resumed = MetricsLogger(tmp_path, drop_after=4)
    assert "dropping 2 record(s) after step 4" in caplog.text
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4]
    resumed.log(5, {"reward": 50.0})
    assert [(r["step"], r["reward"]) for r in read_metrics(tmp_path)][-2:] == [(4, 4.0), (5, 50.0)]
    assert MetricsLogger(tmp_path, drop_after=5).history == read_metrics(tmp_path), "nothing to drop: unchanged"


def test_logger_rejects_bad_input(tmp_path):
    import numpy as np

    logger = MetricsLogger(tmp_path)
    with pytest.raises(TypeError, match="step must be an int"):
        logger.log(1.5, {"reward": 1.0})
    with pytest.raises(TypeError, match="'reward' must be a number"):
        logger.log(0, {"reward": "high"})
    with pytest.raises(ValueError, match="'time'"):
        logger.log(0, {"time": 1.0})
    with pytest.raises(TypeError, match="'v' must be a scalar"):
        logger.log(0, {"v": np.ones(2)})
    assert logger.history == [] and not (tmp_path / "metrics.jsonl").exists()


def test_read_metrics_errors(tmp_path, caplog):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_metrics(tmp_path)
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "reward": 1}\n{"step": 1, "rew')
    assert [r["step"] for r in read_metrics(tmp_path)] == [0]  # cut-off last line skipped
    assert "cut-off last line" in caplog.text
    path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not valid JSON"):
        read_metrics(tmp_path)


# ---------------------------------------------------------------- progress bar


def test_progress_bar_writes_a_line_per_step_when_not_a_tty():
    out = io.StringIO()
    bar = ProgressBar(total_steps=7, desc="grpo", file=out)
    assert bar.mode == "line"
    for step in range(7):
        bar.update(step, {"reward": 0.12345, "samples_per_s": 42.0})
    bar.close()
    lines = [line.rsplit(" eta=", 1)[0] for line in out.getvalue().splitlines()]
    assert lines == [f"grpo: step {k}/7 reward=0.123 samples/s=42.0" for k in range(1, 8)]


def test_progress_bar_forced_and_disabled(caplog):
    out = io.StringIO()
    with ProgressBar(total_steps=4, desc="ppo", force_bar=True, file=out) as bar:
        assert bar.mode == "bar"
        bar.update(1, {"reward": 0.5})
    text = out.getvalue()
    assert "ppo" in text and "2/4" in text and "reward=0.500" in text
    caplog.set_level(logging.INFO)
    off = ProgressBar(total_steps=2, enabled=False, file=io.StringIO())
    off.update(1, {"reward": 1.0})
    assert off.mode == "off" and "step" not in caplog.text
    with pytest.raises(ValueError, match="total_steps"):
        ProgressBar(total_steps=0)


# ---------------------------------------------------------------- summary


def test_summary_table_layout():
    table = summary_table([{"run": "old", "reward": 0.12345, "samples/s": 1234.5, "lr": 1e-7},
                           {"run": "new-engine", "reward": 2, "lr": None}],
                          ["run", "reward", "samples/s", "lr"])
    assert table.splitlines() == [
        "run         reward  samples/s     lr",
        "----------  ------  ---------  -----",
        "old          0.123   1234.500  1e-07",
        "new-engine       2          -      -",
    ]
    with pytest.raises(ValueError, match="columns"):
        summary_table([], [])


def test_run_summary_numbers():
    history = [{"step": s, "time": 100.0 + 2 * s, "reward": float(s), "samples_per_s": 10.0 * (s + 1),
                "weight_sync_s": 0.5} for s in range(10)]
    history[4]["reward"] = math.nan
    del history[9]["weight_sync_s"]
    summary = run_summary(history)
    assert summary == {"steps": 10, "samples_per_s": pytest.approx(55.0), "reward_start": pytest.approx(1.0),
                       "reward_end": pytest.approx(8.0), "weight_sync_s_per_step": pytest.approx(0.5),
                       "wall_s": pytest.approx(18.0)}
    sparse = run_summary([{"step": 0, "time": 5.0, "loss": 1.0}])
    assert sparse["reward_start"] is None and sparse["samples_per_s"] is None and sparse["wall_s"] == 0.0
    with pytest.raises(ValueError, match="empty"):
        run_summary([])


# ---------------------------------------------------------------- plot


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5000


def test_plot_one_run(tmp_path):
    run = tmp_path / "run-a"
    _fill(run)
    out = plot_run(run)
    assert out == run / "metrics.png"
    _assert_png(out)


def test_plot_overlays_runs_and_skips_missing_keys(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="coati_relay.observe.plotting")
    _fill(tmp_path / "old", loss=False)
    _fill(tmp_path / "new", reward_offset=0.3)
    one_key = plot_run([tmp_path / "old", tmp_path / "new"], tmp_path / "cmp" / "both.png",
                       keys=("reward", "kl"))
    _assert_png(one_key)
    assert "skipping" in caplog.text and "kl" in caplog.text
    two_keys = plot_run([tmp_path / "old", tmp_path / "new"])
    assert two_keys == tmp_path / "old" / "metrics_compare.png"
    _assert_png(two_keys)
    assert two_keys.stat().st_size != one_key.stat().st_size


def test_plot_errors(tmp_path):
    with pytest.raises(ValueError, match=r"no metrics at .*nothing/metrics\.jsonl"):
        plot_run(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"empty/metrics\.jsonl holds no metrics"):
        plot_run(tmp_path / "empty")
    _fill(tmp_path / "r")
    with pytest.raises(ValueError, match=r"none of \['kl'\].*logged metrics are \['loss', 'reward'\]"):
        plot_run(tmp_path / "r", keys="kl")
