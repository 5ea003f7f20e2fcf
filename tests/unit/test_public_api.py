"""The engine's public names: importable from `coati_relay`, listed by `dir` and `__all__`, loaded on first use; and
`launch_distributed`'s docstring, which documents every keyword `build_run_config` takes."""
from __future__ import annotations

import inspect
import subprocess
import sys

import coati_relay
from coati_relay.assembly.build import build_run_config
from coati_relay.config.keys import IGNORED_LAUNCH_KEYS
from coati_relay.config.launch_keywords import LAUNCH_KEYWORDS

PUBLIC = ("launch_distributed", "RunResult", "register_reward", "register_algorithm", "register_estimator",
          "build_tiny_model", "ConfigError", "RunFailed", "build_run_config", "write_toy_dataset",
          "CallbackError", "StopRun")


def test_public_names_import_and_are_listed():
    from coati_relay import RunResult, build_tiny_model, register_reward
    from coati_relay.algorithms import register
    from coati_relay.observe.run_result import RunResult as result_class
    from coati_relay.rewards import register_reward as registry_register_reward
    from coati_relay.toy import build_tiny_model as toy_builder

    assert (RunResult, build_tiny_model, register_reward) == (result_class, toy_builder, registry_register_reward)
    assert coati_relay.register_algorithm is register
    assert set(PUBLIC) == set(coati_relay.__all__)
    assert set(PUBLIC) <= set(dir(coati_relay))


def test_launch_zero_bubble_is_the_module_with_colossalchat_s_entry():
    """As ColossalChat's ``coati.distributed.launch_zero_bubble``: a module whose `launch_distributed` is the
    zero-bubble entry; the package attribute of that name is the module, however it is reached."""
    from coati_relay import launch_zero_bubble
    from coati_relay.launch_zero_bubble import launch_distributed

    assert launch_zero_bubble.__name__ == "coati_relay.launch_zero_bubble"
    assert coati_relay.launch_zero_bubble is launch_zero_bubble and "launch_zero_bubble" in dir(coati_relay)
    assert launch_distributed is launch_zero_bubble.launch_distributed is not coati_relay.launch_distributed
    doc = launch_distributed.__doc__
    assert "\n    data_actor_buffer_size_limit (ColossalChat): the data buffer, in prompts" in doc
    assert "\n    n_behind (extension here" in doc and "data_actor_buffer_size_limit: " not in doc


def test_an_unknown_name_is_an_attribute_error():
    try:
        coati_relay.no_such_name
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("coati_relay.no_such_name did not raise")


def test_import_coati_relay_loads_none_of_the_heavy_libraries():
    code = ("import sys, coati_relay; dir(coati_relay); "
            "print(sorted(m for m in ('torch', 'transformers', 'ray', 'huggingface_hub', 'coati_relay.launch') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_launch_keyword_is_documented_once():
    params = [p for p in inspect.signature(build_run_config).parameters if p != "ignored"]
    assert sorted(LAUNCH_KEYWORDS) == sorted(params)
    doc = coati_relay.launch_distributed.__doc__
    for name in [*params, *IGNORED_LAUNCH_KEYS]:
        assert f"\n    {name} (" in doc or f"\n    {name}: " in doc, name
    assert "num_episodes (ColossalChat): passes over the prompts. On resume it is the total" in doc
    assert "Hugging Face Hub ID" in doc
