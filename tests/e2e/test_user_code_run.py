"""A whole run with a reward and an advantage estimator registered in a module that only the driver can import:
the producer scores with the user's reward and the consumer trains with the user's estimator, in real actors."""
from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
from run_helpers import run_kwargs

pytestmark = pytest.mark.slow

MODULE = "driver_only_run_rewards"
SOURCE = textwrap.dedent('''
    import torch

    from coati_relay.algorithms import Advantages, AlgorithmSpec, register
    from coati_relay.rewards import register_reward

    VALUE = 0.375


    @register_reward("driver_only_constant")
    def constant_reward(responses, gt_answers, prompts):
        return torch.full((len(responses),), VALUE)


    @register("advantage", "driver_only_centered", spec=AlgorithmSpec(min_group_size=2))
    def centered(inputs, params):
        return Advantages((inputs.rewards - inputs.rewards.mean()).unsqueeze(1))
''')


@pytest.fixture
def user_module(tmp_path):
    folder = tmp_path / "driver-only"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))  # the driver's path only: Ray gives workers the script's folder and the cwd
    yield importlib.import_module(MODULE)
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)
    from coati_relay import algorithms
    from coati_relay.rewards import registry

    registry._REWARDS.pop("driver_only_constant", None)
    algorithms.unregister("advantage", "driver_only_centered")


def test_driver_registered_reward_and_estimator_run_in_the_actors(ray_cluster, tiny_model_path, data, tmp_path,
                                                                  user_module):
    from coati_relay import launch_distributed

    kw = run_kwargs(tiny_model_path, data, tmp_path / "run", algo="DRIVER_ONLY_CENTERED", backend="transformers",
                    rounds=2, num_producers=1, num_consumer_procs=1)
    kw["grpo_config"] = {**kw["grpo_config"], "reward_fn_type": "driver_only_constant"}
    result = launch_distributed(**kw)
    assert [h["version"] for h in result.history] == [1, 2, 3, 4]
    assert all(h["reward"] == pytest.approx(user_module.VALUE) for h in result.history), \
        "every rollout was scored by the user's reward"
