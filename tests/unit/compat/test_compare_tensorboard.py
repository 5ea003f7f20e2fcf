"""``coati-relay compare --tensorboard DIR``: each side of a report is a TensorBoard run holding its rows."""
from __future__ import annotations

from pathlib import Path

from test_compare_report import comparison

from coati_compat.compare import cli, tensorboard_runs

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "legacy"


def read_run(run_dir: Path):
    """step -> {tag: value} of a run's scalars, read by tensorboard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        for event in acc.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto)
            if value.dtype.kind == "f":
                out.setdefault(event.step, {})[tag] = value.item()
    return out


def test_each_side_becomes_a_run_with_its_rows(tmp_path):
    data = comparison([[0.1, 0.2, 0.3], [0.15, 0.25, 0.3]], [0.1, 0.2, 0.35])
    data["migrated"]["rows"][1]["critic_loss"] = None  # a missing value is left out, not written as 0
    (tmp_path / "migrated").mkdir()
    (tmp_path / "migrated" / "events.out.tfevents.0.stale").write_bytes(b"")  # an earlier report's run
    written = tensorboard_runs.write_runs(data, tmp_path)
    assert [p.name for p in written] == ["legacy-1", "legacy-2", "migrated"]
    assert not (tmp_path / "migrated" / "events.out.tfevents.0.stale").exists()
    for run_dir, side in zip(written, data["legacy"] + [data["migrated"]]):
        want = {r["step"]: {k: float(v) for k, v in r.items() if k != "step" and v is not None} for r in side["rows"]}
        assert read_run(run_dir) == want, run_dir.name
    assert "critic_loss" not in read_run(tmp_path / "migrated")[2]


def test_the_option_is_parsed_and_needs_tensorboard(monkeypatch, capsys):
    assert cli.parse(["x.py", "--tensorboard", "tb", "--"]).tensorboard == "tb"
    monkeypatch.setattr(tensorboard_runs.importlib.util, "find_spec", lambda name: None)
    assert cli._run(cli.argparse.Namespace(words=[str(EXAMPLES / "four_role_ppo.py"), "--tensorboard", "tb",
                                                  "--"])) == 2
    assert "--tensorboard needs the tensorboard package: pip install tensorboard" in capsys.readouterr().err
