"""Whole runs with a user's policy loss named in ``grpo_config``: registered in a module only the driver can import
(colocated, and disaggregated in real actors) or in the ``__main__`` script of a fresh driver. The loss is twice the
built-in one, so the first optimizer step's gradient norm is twice that of a run with the built-in (the runs are
deterministic: colocated and disaggregated give the same numbers, tests/e2e/test_colocated_runs.py)."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from run_helpers import run_kwargs

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
MODULE = "driver_only_losses"
LOSS = textwrap.dedent('''
    from coati_relay.algorithms import policy_loss, register


    @register("policy_loss", "driver_only_doubled")
    def doubled(logp, old_logp, advantages, mask, **options):
        loss, stats = policy_loss(logp, old_logp, advantages, mask, **options)
        return 2 * loss, stats
''')
SCRIPT = LOSS + textwrap.dedent('''

    if __name__ == "__main__":
        import json
        import sys

        from run_helpers import run_kwargs

        from coati_relay import launch_distributed

        model, data, run_dir = sys.argv[1:4]
        kw = run_kwargs(model, data, run_dir, backend="transformers", rounds=1, num_producers=1,
                        num_consumer_procs=1, inference_batch_size=8, train_batch_size=8)
        kw["grpo_config"] = {**kw["grpo_config"], "policy_loss": "driver_only_doubled"}
        print(json.dumps(launch_distributed(**kw).history))
''')


def one_round(model, data, run_dir, **over):
    """One round of the toy run on one producer and one consumer: 8 prompts x 4 responses, one optimizer step."""
    return run_kwargs(model, data, run_dir, backend="transformers", rounds=1, num_producers=1, num_consumer_procs=1,
                      inference_batch_size=8, train_batch_size=8, **over)


@pytest.fixture(scope="module")
def built_in(tiny_model_path, data, tmp_path_factory):
    """The first step's metrics of the run with the built-in loss (colocated)."""
    from coati_relay import launch_distributed

    kw = one_round(tiny_model_path, data, tmp_path_factory.mktemp("built-in"), colocate=True)
    (step,) = launch_distributed(**kw).history
    assert step["grad_norm"] > 0
    return step


@pytest.fixture
def user_module(tmp_path):
    folder = tmp_path / "driver-only"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(LOSS)
    sys.path.insert(0, str(folder))  # the driver's path only: Ray gives workers the script's folder and the cwd
    yield importlib.import_module(MODULE)
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)
    from coati_relay import algorithms

    algorithms.unregister("policy_loss", "driver_only_doubled")


def _doubled(step, built_in) -> None:
    assert step["version"] == 1
    assert step["grad_norm"] == pytest.approx(2 * built_in["grad_norm"], rel=1e-4), \
        "the learner called the user's loss: twice the built-in's gradient"
    assert step["reward"] == pytest.approx(built_in["reward"]), "the same rollouts"


@pytest.mark.parametrize("colocate", [True, False], ids=["colocated", "disaggregated"])
def test_a_driver_registered_policy_loss_trains_in_both_placements(request, tiny_model_path, data, tmp_path,
                                                                   user_module, built_in, colocate):
    from coati_relay import launch_distributed

    if not colocate:
        request.getfixturevalue("ray_cluster")
    kw = one_round(tiny_model_path, data, tmp_path / "run", colocate=colocate)
    kw["grpo_config"] = {**kw["grpo_config"], "policy_loss": "driver_only_doubled"}
    (step,) = launch_distributed(**kw).history
    _doubled(step, built_in)


def test_a_policy_loss_registered_in_a_main_script_trains_in_the_actors(tiny_model_path, data, tmp_path, built_in):
    script = tmp_path / "train_with_my_loss.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(script), tiny_model_path, str(data), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    (step,) = json.loads(done.stdout.strip().splitlines()[-1])
    _doubled(step, built_in)
