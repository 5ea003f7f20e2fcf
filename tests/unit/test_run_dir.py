"""A run that starts afresh gets a run directory of its own (`coati_relay.config.run_dir`): left out, ``runs/NAME``
or the first ``runs/NAME-K`` that holds no earlier run; given, one that holds an earlier run is refused unless the
run resumes it."""
from __future__ import annotations

import logging

import pytest
from small_run import small_run_kwargs

from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.config.run_dir import default_run_dir, holds_run


def _earlier_run(run_dir, lines=1):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "time": 0.0}\n' * lines)


def test_a_run_dir_holds_a_run_by_its_metrics_or_its_checkpoints(tmp_path):
    assert not holds_run(tmp_path / "absent")
    _earlier_run(tmp_path / "empty", lines=0)
    assert not holds_run(tmp_path / "empty"), "an empty metrics.jsonl is no run"
    _earlier_run(tmp_path / "logged")
    assert holds_run(tmp_path / "logged")
    step = tmp_path / "saved" / "checkpoints" / "step-000004"
    step.mkdir(parents=True)
    (step / "state.json").write_text("{}")
    assert holds_run(tmp_path / "saved")


def test_a_fresh_run_takes_the_first_numbered_directory_free_of_a_run(tmp_path, caplog):
    base = tmp_path / "runs" / "GRPO"
    assert default_run_dir(base, fresh=True) == base
    _earlier_run(base)
    with caplog.at_level(logging.WARNING, logger="coati_relay.config.run_dir"):
        assert default_run_dir(base, fresh=True) == tmp_path / "runs" / "GRPO-2"
    assert "holds an earlier run; this run writes to" in caplog.text and "GRPO-2" in caplog.text
    _earlier_run(tmp_path / "runs" / "GRPO-2")
    (tmp_path / "runs" / "GRPO-3").mkdir()  # made, never written: free
    assert default_run_dir(base, fresh=True) == tmp_path / "runs" / "GRPO-3"
    assert default_run_dir(base, fresh=False) == base, "a resumed run continues where it ran"


def test_build_picks_the_numbered_default_and_refuses_a_given_run_dir_holding_a_run(tmp_path, tiny_model_path,
                                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    kw = small_run_kwargs(tmp_path, tiny_model_path, project_name="my project")
    kw.pop("run_dir")
    _earlier_run(tmp_path / "runs" / "my_project")
    cfg = build_run_config(**kw)
    assert str(cfg.checkpointing.run_dir) == "runs/my_project-2"
    given = small_run_kwargs(tmp_path, tiny_model_path, run_dir="runs/my_project")
    with pytest.raises(ConfigError, match=r"run_dir='runs/my_project' holds an earlier run .*resume_from"):
        build_run_config(**given)
