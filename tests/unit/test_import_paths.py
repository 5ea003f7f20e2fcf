"""User code by import path (``module:function``, ``path/to/file.py:function``) in a run's config and
``coati-relay run --import``: resolved in the driver, shipped to the actors by value, every failure a config error
that names the module or the attribute."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from coati_relay import algorithms
from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.cli import main
from coati_relay.config.import_paths import ImportPathError, is_import_path, resolve_import_path
from coati_relay.rewards import registry as rewards
from tests.unit.small_run import small_run_kwargs

USER_FILE = textwrap.dedent('''
    import torch

    from coati_relay.rewards import register_reward


    def exact(responses, gt_answers, prompts):
        return torch.tensor([float(len(r)) for r in responses])


    @register_reward("import_path_registered")
    def registered(responses, gt_answers, prompts):
        return [0.5] * len(responses)


    def clipped(logp, old_logp, advantages, mask, **options):
        return (logp * mask).sum(), {}


    class Hook:
        def on_round_end(self, step, metrics):
            pass
''')


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    """``arith_user.py`` in a folder of its own, neither on sys.path nor imported; forgotten afterwards."""
    folder = tmp_path / "user"
    folder.mkdir()
    path = folder / "arith_user.py"
    path.write_text(USER_FILE)
    yield path
    sys.modules.pop("arith_user", None)
    rewards._REWARDS.pop("import_path_registered", None)
    for name in algorithms.names("policy_loss"):
        if "arith_user" in name:
            algorithms.unregister("policy_loss", name)


@pytest.mark.parametrize("value, expected", [("mod:fn", True), ("a/b.py:fn", True), ("toy_letter", False),
                                             ("http://host:80", False), (":fn", False), ("mod:", False), (3, False)])
def test_what_counts_as_an_import_path(value, expected):
    assert is_import_path(value) is expected


def test_a_file_and_a_module_resolve_to_the_same_function(user_file, monkeypatch):
    by_file = resolve_import_path(f"{user_file}:exact")
    monkeypatch.syspath_prepend(str(user_file.parent))
    assert resolve_import_path("arith_user:exact") is by_file
    assert resolve_import_path("arith_user:Hook.on_round_end") is by_file.__globals__["Hook"].on_round_end


@pytest.mark.parametrize("path, message", [
    ("no_such_user_module:f", r"cannot import module 'no_such_user_module'.*run from the folder that holds "
                              r"no_such_user_module\.py"),
    ("missing/file.py:f", r"'missing/file\.py' is no file"),
])
def test_a_module_that_cannot_be_imported_is_named(path, message):
    with pytest.raises(ImportPathError, match=message):
        resolve_import_path(path)


def test_a_missing_attribute_is_named_with_the_closest_one(user_file):
    with pytest.raises(ImportPathError, match=r"arith_user has no attribute 'exakt' \(did you mean 'exact'\?\)"):
        resolve_import_path(f"{user_file}:exakt")


def test_a_module_that_raises_on_import_says_so(tmp_path):
    bad = tmp_path / "raising_user_module.py"
    bad.write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(ImportPathError, match=r"raised RuntimeError: no GPU here"):
        resolve_import_path(f"{bad}:f")
    assert "raising_user_module" not in sys.modules


def test_reward_loss_and_hook_by_import_path_build_and_ship(user_file, tmp_path, tiny_model_path):
    from ray import cloudpickle

    loss = f"{user_file}:clipped"
    kw = small_run_kwargs(tmp_path, tiny_model_path, callbacks=[f"{user_file}:Hook"],
                          grpo_config={"lr": 1e-3, "reward_fn": f"{user_file}:exact", "policy_loss": loss})
    cfg = build_run_config(**kw)
    assert cfg.reward(["ab", "abcd"], [None, None], ["", ""]).tolist() == [2.0, 4.0]
    assert type(cfg.callbacks[0]).__name__ == "Hook"
    assert [(e.kind, e.name) for e in cfg.user_code.entries] == [("policy_loss", loss.lower())]
    # an actor: a fresh interpreter that cannot import the file's module
    (tmp_path / "cfg.pkl").write_bytes(cloudpickle.dumps(cfg.for_actors()))  # the callbacks stay in the driver
    actor = ("import json, sys; from ray import cloudpickle; from coati_relay import algorithms; "
             "cfg = cloudpickle.loads(open(sys.argv[1], 'rb').read()); "
             "print(json.dumps([cfg.reward(['abc'], [None], ['']).tolist(), "
             "algorithms.get('policy_loss', cfg.algo.policy_loss).__name__, 'arith_user' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", actor, str(tmp_path / "cfg.pkl")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[3.0], "clipped", False]


def test_a_wrong_import_path_is_a_config_error(tmp_path, tiny_model_path):
    kw = small_run_kwargs(tmp_path, tiny_model_path, grpo_config={"lr": 1e-3, "reward_fn": "nowhere_mod:f",
                                                                   "kl_estimator": "nowhere_mod:k"})
    with pytest.raises(ConfigError) as err:
        build_run_config(**kw)
    assert "grpo_config['reward_fn']: cannot import module 'nowhere_mod'" in str(err.value)
    assert "grpo_config['kl_estimator']: cannot import module 'nowhere_mod'" in str(err.value)


def _config(tmp_path, tiny_model_path, **over) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(small_run_kwargs(tmp_path, tiny_model_path, **over)))
    return str(path)


def test_cli_imports_a_module_that_registers_a_reward(user_file, tmp_path, tiny_model_path, capsys, monkeypatch):
    monkeypatch.chdir(user_file.parent)
    config = _config(tmp_path, tiny_model_path, grpo_config={"reward_fn_type": "import_path_registered"})
    assert main(["run", config, "--import", "arith_user", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert yaml.safe_load(printed)["imports"] == ["arith_user"], "the printed config imports what --import did"
    assert "#   reward: import_path_registered" in printed.splitlines()


def test_cli_takes_the_imports_key_and_a_reward_by_set(user_file, tmp_path, tiny_model_path, capsys):
    config = _config(tmp_path, tiny_model_path, imports=[str(user_file)])
    assert main(["run", config, "--set", f"grpo_config.reward_fn={user_file}:registered", "--dry-run"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["grpo_config"]["reward_fn"] == f"{user_file}:registered" and printed["imports"] == [str(user_file)]


def test_cli_an_import_that_fails_exits_2_naming_the_module(tmp_path, tiny_model_path, capsys):
    config = _config(tmp_path, tiny_model_path)
    assert main(["run", config, "--import", "nowhere_mod", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("coati-relay run: cannot import module 'nowhere_mod'") and "\n" not in err
