"""``coati-relay run --set key.sub=value`` and ``--dry-run``: overrides read as YAML and applied before the checks;
a dry run prints the resolved config and starts nothing."""
from __future__ import annotations

import pytest
import yaml

from coati_relay.cli import main
from coati_relay.config.overrides import OverrideError, apply_overrides
from tests.unit.small_run import small_run_kwargs


def test_overrides_set_nested_keys_as_yaml_values_and_leave_the_input_alone():
    given = {"grpo_config": {"lr": 1e-3}, "num_episodes": 1}
    out = apply_overrides(given, ["grpo_config.lr=1e-5", "num_episodes=3", "report_to=[tensorboard]",
                                  "generate_config.stop=null", "train_model_config.lora.r=4"])
    assert out == {"grpo_config": {"lr": 1e-5}, "num_episodes": 3, "report_to": ["tensorboard"],
                   "generate_config": {"stop": None}, "train_model_config": {"lora": {"r": 4}}}
    assert given == {"grpo_config": {"lr": 1e-3}, "num_episodes": 1}


@pytest.mark.parametrize("item, message", [("grpo_config.lr", "write KEY=VALUE"), ("a..b=1", "write KEY=VALUE"),
                                           ("num_episodes.x=1", "num_episodes is 1, not a section")])
def test_malformed_overrides_say_how_to_write_them(item, message):
    with pytest.raises(OverrideError, match=message):
        apply_overrides({"num_episodes": 1}, [item])


def test_dry_run_prints_a_config_run_takes_back_with_the_resolved_values(tmp_path, tiny_model_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(small_run_kwargs(tmp_path, tiny_model_path)))
    assert main(["run", str(config), "--set", "grpo_config.lr=0.25", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert yaml.safe_load(printed)["grpo_config"]["lr"] == 0.25, "the override is in the keywords"
    resolved = yaml.safe_load("\n".join(line[4:] for line in printed.splitlines()[
        printed.splitlines().index("# resolved (defaults filled in, as the run uses them; not read back):") + 1:]))
    assert resolved["algo"]["lr"] == 0.25 and resolved["roles"]["num_consumers"] == 1
    again = tmp_path / "again.yaml"
    again.write_text(printed)
    assert main(["run", str(again), "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(printed), "run takes the printed config back"
    assert not (tmp_path / "run").exists(), "a dry run started the run"


def test_a_wrong_override_exits_2_before_anything_starts(tmp_path, tiny_model_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(small_run_kwargs(tmp_path, tiny_model_path)))
    assert main(["run", str(config), "--set", "grpo_config.lr=-1", "--dry-run"]) == 2
    assert "lr" in capsys.readouterr().err
