"""A `resume_from` that does not exist: the hint names the layout checkpoints really have (run_dir/checkpoints/
step-NNNNNN), and both forms it names are accepted."""
from __future__ import annotations

import re

import pytest
from small_run import small_run_kwargs

from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.checkpoint import save_checkpoint


def test_the_hint_names_where_checkpoints_are_written(tmp_path, tiny_model_path):
    with pytest.raises(ConfigError) as err:
        build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, resume_from=str(tmp_path / "no-such-run")))
    hinted = re.search(r"pass a checkpoint directory \(run_dir/([\w/-]+)\)", str(err.value))
    assert hinted, str(err.value)
    run_dir = tmp_path / "old-run"
    written = save_checkpoint(run_dir, 7, {}, {"round": 1})
    assert written.relative_to(run_dir).as_posix() == hinted.group(1).replace("NNNNNN", "000007")
    for given in (written, run_dir):  # the two forms the hint offers
        cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, resume_from=str(given)))
        assert cfg.checkpointing.resume_from == str(given)
