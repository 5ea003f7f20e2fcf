"""One table maps legacy strategy keywords for the shims and the rewriter (`coati_compat.legacy.tables`), and a legacy
script on a GPU host makes the engine's choices of plugin settings, device, precision and optimizer."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from coati_compat.legacy import strategies
from coati_compat.legacy.tables import LEGACY_STRATEGIES, STRATEGY_DEFAULTS, plugin_config
from coati_compat.migrate import migrate_source
from coati_relay.assembly.build import _plugin
from coati_relay.training import plugins

ROOT = Path(__file__).resolve().parents[3]
TRAINER_STRATEGY = "strategy_fn=partial(get_strategy_from_args, args.trainer_strategy)"


@pytest.fixture
def gpu_host(monkeypatch):
    """The facts of a host with one CUDA device; strategies skip the process group."""
    monkeypatch.setattr(plugins, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(strategies.Strategy, "setup_distributed", lambda self: None)
    monkeypatch.setattr(strategies.NaiveStrategy, "setup_distributed", lambda self: None)


def _engine_plugin(config):
    """(plugin, options) the engine's launch validation makes of a ``plugin_config``, gradient clipping included
    (`TrainingBackend` hands ``max_norm`` to the plugin)."""
    errors, differences = [], []
    plugin, max_norm, _ = _plugin(errors, config, 1, differences)
    assert not errors, errors
    return plugin.name, {**plugin.options, **({"max_norm": max_norm} if max_norm else {})}


@pytest.mark.parametrize("cls", sorted(STRATEGY_DEFAULTS))
def test_table_defaults_are_the_constructors_defaults(cls):
    params = inspect.signature(getattr(strategies, cls)).parameters
    assert {k: p.default for k, p in params.items() if k not in ("self", "seed")} == STRATEGY_DEFAULTS[cls]


@pytest.mark.parametrize("cls,kwargs,picked", [
    ("GeminiStrategy", {"placement_policy": "cuda"}, {"placement_policy": "static", "offload_param_frac": 0.0}),
    ("GeminiStrategy", {"placement_policy": "cpu"}, {"placement_policy": "static", "offload_optim_frac": 1.0}),
    ("GeminiStrategy", {"placement_policy": "auto"}, {"placement_policy": "auto", "precision": "fp16"}),
    ("GeminiStrategy", {"offload_optim_frac": 0.5, "max_norm": 1.0}, {"offload_optim_frac": 0.5, "max_norm": 1.0}),
    ("LowLevelZeroStrategy", {"stage": 1}, {"stage": 1, "cpu_offload": False, "precision": "fp16"}),
    ("LowLevelZeroStrategy", {"stage": 2, "placement_policy": "cpu"}, {"stage": 2, "cpu_offload": True}),
    ("ColossalAIStrategy", {"stage": 3, "placement_policy": "cpu"}, {"offload_param_frac": 1.0}),
    ("ColossalAIStrategy", {"stage": 2, "initial_scale": 32}, {"stage": 2, "initial_scale": 32}),
    ("DDPStrategy", {}, {}),
    ("NaiveStrategy", {}, {}),
])
def test_a_rewritten_script_and_the_shim_pick_the_same_plugin(gpu_host, cls, kwargs, picked):
    """A legacy script whose trainers build ``cls(**kwargs)``, rewritten, trains with the plugin and settings the
    shim's strategy picks for the same keywords on a CUDA host."""
    legacy = (ROOT / "examples" / "legacy" / "ppo_many_roles.py").read_text()
    assert TRAINER_STRATEGY in legacy
    call = f"{cls}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    script = legacy.replace(TRAINER_STRATEGY, f"strategy_fn=lambda: {call}")
    script = script.replace("import ray\n", f"import ray\nfrom coati.trainer.strategies import {cls}\n", 1)
    rewritten = migrate_source(script, "strategy_script.py").launch_kwargs({})["plugin_config"]
    strategy = getattr(strategies, cls)(**kwargs)
    shim = (strategy.plugin_name or "ddp", strategy.plugin_options)  # naive: one consumer trains as ddp does
    assert _engine_plugin(rewritten) == shim
    assert {k: shim[1][k] for k in picked} == picked


@pytest.mark.parametrize("name,expected", [
    ("naive", ("ddp", "float32", "fused_adamw")), ("ddp", ("ddp", "float32", "fused_adamw")),
    ("colossalai_zero2", ("zero2", "float16", "fused_adamw")),
    ("colossalai_zero2_cpu", ("zero2", "float16", "hybrid_adam")),
    ("colossalai_gemini", ("gemini", "float16", "hybrid_adam")),
    ("colossalai_gemini_cpu", ("gemini", "float16", "hybrid_adam")),
])
def test_a_legacy_script_on_a_gpu_host_makes_the_engines_choices(gpu_host, name, expected):
    """--trainer_strategy ``name``: the legacy strategy and the migrated run's engine pick the same plugin, compute
    device, precision and optimizer kind from the same GPU-host facts."""
    from coati.ray.utils import get_strategy_from_args

    from coati_compat.legacy import datasets, replay_buffer
    from coati_compat.shims.ppo_trainer import _legacy_adam
    from coati_relay.cluster.devices import accelerator_device

    strategy = get_strategy_from_args(name)
    legacy_plugin = (strategy.plugin_name or "ddp", strategy.plugin_options)
    engine_plugin = _engine_plugin(plugin_config(name))
    assert legacy_plugin == engine_plugin
    choices = [(p, plugins.precision_dtype(p, o), plugins.optimizer_kind(p, o, cuda=True))
               for p, o in (legacy_plugin, engine_plugin)]
    assert choices == [expected, expected]
    assert datasets.accelerator_device() == replay_buffer.accelerator_device() == accelerator_device() == torch.device(
        "cuda", 0)
    if expected[2] == "fused_adamw":  # the legacy trainer's Adam: torch's fused kernel, as the engine's AdamW
        adam = _legacy_adam(strategy, torch.nn.Linear(2, 2), 1e-7)
        assert isinstance(adam, torch.optim.Adam) and adam.defaults["fused"] is True


def test_every_legacy_strategy_name_is_covered():
    assert set(LEGACY_STRATEGIES) == {"naive", "ddp", "colossalai_zero2", "colossalai_zero2_cpu", "colossalai_gemini",
                                      "colossalai_gemini_cpu"}
