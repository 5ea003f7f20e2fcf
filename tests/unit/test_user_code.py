"""A reward and an advantage estimator registered in the driver, in a module the actors cannot import, reach the
actors through the run config: checked here on the bytes an actor receives, unpickled in a fresh interpreter that
cannot import that module (the slow end-to-end version runs them in real actors: tests/e2e/test_user_code_run.py)."""
from __future__ import annotations

import copy
import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from coati_relay import algorithms
from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.rewards import registry as rewards
from coati_relay.toy import write_toy_dataset

MODULE = "driver_only_rewards"
USER_MODULE = textwrap.dedent('''
    import threading

    import torch

    from coati_relay.algorithms import Advantages, AlgorithmSpec, register
    from coati_relay.rewards import register_reward

    SCALE = 0.25
    LOCK = threading.Lock()


    def _length(text):  # a helper of the module: it travels with the reward
        return float(len(text))


    @register_reward("driver_only_length")
    def length_reward(responses, gt_answers, prompts):
        return torch.tensor([SCALE * _length(r) for r in responses])


    @register("advantage", "driver_only_baseline", spec=AlgorithmSpec(min_group_size=2, defaults={"beta": 0.0}))
    def baseline(inputs, params):
        return Advantages((inputs.rewards - inputs.rewards.mean()).unsqueeze(1))


    def locked_reward(responses, gt_answers, prompts):
        with LOCK:
            return [0.0] * len(responses)
''')

# What a fresh actor process does with the run config it receives: the producer's and the consumer's lookups.
ACTOR = textwrap.dedent('''
    import json, sys
    import torch
    from ray import cloudpickle
    cfg = cloudpickle.loads(open(sys.argv[1], "rb").read())
    assert "driver_only_rewards" not in sys.modules
    from coati_relay import algorithms
    from coati_relay.rewards import get_reward_fn
    scores = get_reward_fn(cfg.reward)(["ab", "abcd"], [None, None], ["", ""])
    estimator = algorithms.get("advantage", cfg.core_algo)
    out = estimator(algorithms.AdvantageInputs(torch.tensor([1.0, 3.0]), 2, torch.ones(2, 1), None, None, None),
                    cfg.algo)
    print(json.dumps({"scores": scores.tolist(), "advantages": out.advantages.flatten().tolist(),
                      "min_group_size": algorithms.spec(cfg.core_algo).min_group_size}))
''')


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    """The user's module, importable in this process only (its folder is on this process's sys.path alone)."""
    folder = tmp_path_factory.mktemp("driver-only")
    (folder / f"{MODULE}.py").write_text(USER_MODULE)
    sys.path.insert(0, str(folder))
    module = importlib.import_module(MODULE)
    yield module
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)
    rewards._REWARDS.pop("driver_only_length", None)
    algorithms.unregister("advantage", "driver_only_baseline")


@pytest.fixture(scope="module")
def kwargs(tmp_path_factory, tiny_model_path):
    data = write_toy_dataset(tmp_path_factory.mktemp("user-code") / "toy.jsonl", num_prompts=8)
    return dict(num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
                inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
                train_dataset_config={"path": str(data), "max_length": 32, "system_prompt": ""},
                inference_model_config={"path": tiny_model_path}, train_model_config={"path": tiny_model_path},
                generate_config={"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0}, plugin_config={},
                num_generations=2)


def _run_without_user_module(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``python *args`` in a fresh interpreter whose path lacks the user module's folder."""
    path = [p for p in sys.path if p and not os.path.isfile(os.path.join(p, f"{MODULE}.py"))]
    return subprocess.run([sys.executable, *args], env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def _in_fresh_actor(tmp_path, payload: bytes) -> subprocess.CompletedProcess:
    """Unpickles ``payload`` as an actor would, then looks the reward and the estimator up as the roles do."""
    (tmp_path / "cfg.pkl").write_bytes(payload)
    (tmp_path / "actor.py").write_text(ACTOR)
    return _run_without_user_module(tmp_path, str(tmp_path / "actor.py"), str(tmp_path / "cfg.pkl"))


def test_registered_entries_reach_a_process_that_cannot_import_them(user_module, kwargs, tmp_path):
    from ray import cloudpickle

    cfg = build_run_config(**kwargs, core_algo="DRIVER_ONLY_BASELINE",
                           grpo_config={"reward_fn_type": "driver_only_length"})
    assert [(e.kind, e.name) for e in cfg.user_code.entries] == [("reward", "driver_only_length"),
                                                                  ("advantage", "driver_only_baseline")]
    assert cfg.algo.beta == 0.0, "the estimator's spec defaults apply in the driver"
    assert copy.deepcopy(cfg).user_code == cfg.user_code
    done = _in_fresh_actor(tmp_path, cloudpickle.dumps(cfg))
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"scores": [0.5, 1.0], "advantages": [-1.0, 1.0], "min_group_size": 2}


def test_a_user_callable_reward_travels_by_value(user_module, kwargs, tmp_path):
    from ray import cloudpickle

    cfg = build_run_config(**kwargs, grpo_config={"reward_fn": user_module.length_reward})
    assert cfg.reward(["abcd"], [None], [""]).tolist() == [1.0], "the driver's copy still calls the function"
    done = _in_fresh_actor(tmp_path, cloudpickle.dumps(cfg))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["scores"] == [0.5, 1.0]


def test_without_shipping_the_actor_cannot_import_the_reward(user_module, tmp_path):
    """The control: the plain function pickles by reference, and the actor's import fails, as it did before."""
    from ray import cloudpickle

    (tmp_path / "cfg.pkl").write_bytes(cloudpickle.dumps(user_module.length_reward))
    done = _run_without_user_module(tmp_path, "-c", "import sys; from ray import cloudpickle; "
                                    "cloudpickle.loads(open(sys.argv[1], 'rb').read())", str(tmp_path / "cfg.pkl"))
    assert done.returncode != 0 and f"No module named '{MODULE}'" in done.stderr


def test_engine_entries_are_not_shipped(kwargs):
    cfg = build_run_config(**kwargs, core_algo="GRPO", grpo_config={"reward_fn_type": "toy_letter"})
    assert cfg.user_code.entries == () and cfg.reward == "toy_letter"
    assert copy.deepcopy(cfg).user_code == cfg.user_code


def test_a_reward_that_cannot_be_pickled_is_refused_up_front(user_module, kwargs):
    with pytest.raises(ConfigError, match=r"grpo_config\['reward_fn'\].*cannot be sent to the actors.*lock"):
        build_run_config(**kwargs, grpo_config={"reward_fn": user_module.locked_reward})
