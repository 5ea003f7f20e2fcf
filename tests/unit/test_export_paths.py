"""`coati_relay.export` refuses what is no run or checkpoint, naming what it expected (no model is built)."""
from __future__ import annotations

import json

import pytest

from coati_relay.export import ExportError, export_checkpoint, find_policy, read_weights


def _checkpoint(run_dir, step, policy=True):
    step_dir = run_dir / "checkpoints" / f"step-{step:06d}"
    step_dir.mkdir(parents=True)
    if policy:
        (step_dir / "policy").mkdir()
        (step_dir / "policy" / "model.pt").write_bytes(b"")
    (step_dir / "state.json").write_text(json.dumps({"step": step}))
    return step_dir


def test_a_path_that_is_no_run_nor_checkpoint_is_refused_with_what_was_expected(tmp_path):
    with pytest.raises(ExportError, match=r"does not exist; pass a run directory .*step-NNNNNN"):
        find_policy(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ExportError, match=r"neither a run directory \(no checkpoints/ in it\) nor a checkpoint"):
        find_policy(tmp_path / "notes.txt")
    with pytest.raises(ExportError, match="neither a run directory"):
        find_policy(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ExportError, match="holds no complete checkpoint"):
        find_policy(tmp_path)


def test_run_dir_resolves_to_its_latest_checkpoint_and_a_step_dir_to_itself(tmp_path):
    _checkpoint(tmp_path, 2)
    latest = _checkpoint(tmp_path, 4)
    (tmp_path / "checkpoints" / "latest").write_text(latest.name)
    assert find_policy(tmp_path) == latest / "policy"
    earlier = tmp_path / "checkpoints" / "step-000002"
    assert find_policy(earlier) == earlier / "policy"
    assert find_policy(earlier / "policy") == earlier / "policy"


def test_checkpoint_without_a_policy_is_refused(tmp_path):
    step_dir = _checkpoint(tmp_path, 1, policy=False)
    (step_dir / "critic").mkdir()
    with pytest.raises(ExportError, match=r"holds no policy/model.pt \(it holds \['critic', 'state.json'\]\)"):
        find_policy(tmp_path)


def test_out_dir_that_holds_files_is_refused_before_reading(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match="not an empty directory"):
        export_checkpoint(tmp_path / "nowhere", tmp_path / "out")


def test_sharded_directory_needs_one_index(tmp_path):
    (tmp_path / "model.pt").mkdir()
    with pytest.raises(ExportError, match=r"expected one \*.index.json"):
        read_weights(tmp_path / "model.pt")
    (tmp_path / "model.pt" / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ExportError, match="has no weight_map"):
        read_weights(tmp_path / "model.pt")


def test_command_exits_2_with_the_message(tmp_path, capsys):
    from coati_relay.cli import main

    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coati-relay export: ") and "neither a run directory" in err


def test_checkpoint_whose_recorded_model_dir_is_gone_asks_for_the_tokenizer(tmp_path, tiny_model_path):
    import shutil
    from pathlib import Path

    step_dir = _checkpoint(tmp_path, 1)
    shutil.copy(Path(tiny_model_path) / "config.json", step_dir / "policy" / "config.json")
    (step_dir / "policy" / "source.json").write_text(json.dumps({"model_path": str(tmp_path / "moved-away")}))
    with pytest.raises(ExportError, match=r"moved-away\) is not here; pass --tokenizer DIR"):
        export_checkpoint(tmp_path, tmp_path / "out")
