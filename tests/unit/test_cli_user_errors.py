"""Every user error of ``coati-relay run`` is one line on stderr and exit code 2, before any actor starts: a config
file that is missing, not YAML or not a mapping, and a resume from a checkpoint at or past the run's last round."""
from __future__ import annotations

import pytest
import yaml

from coati_relay.checkpoint import save_checkpoint
from coati_relay.cli import main
from tests.unit.small_run import small_run_kwargs


def _one_line_exit_2(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("coati-relay run: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("text, message", [
    (None, "no such file; give the path of a YAML file"),
    ("num_episodes: [1\n", "is not valid YAML at line 2, column 1"),
    ("- 1\n- 2\n", "must hold a mapping of launch_distributed keywords, got list"),
])
def test_a_bad_config_file_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "run.yaml"
    if text is not None:
        path.write_text(text)
    assert message in _one_line_exit_2(["run", str(path)], capsys)


@pytest.mark.parametrize("colocate", [True, False])
def test_a_resume_with_too_few_episodes_is_one_line(tmp_path, tiny_model_path, capsys, colocate):
    run_dir = tmp_path / "old"
    save_checkpoint(run_dir, 4, {}, {"round": 4})
    config = tmp_path / "run.yaml"
    kw = small_run_kwargs(tmp_path, tiny_model_path, colocate=colocate, resume_from=str(run_dir))
    if colocate:
        kw.pop("inference_model_config")  # one policy: its path once
    config.write_text(yaml.safe_dump(kw))
    err = _one_line_exit_2(["run", str(config)], capsys)
    assert "is at round 4, the run has only 2; raise num_episodes to train further" in err
