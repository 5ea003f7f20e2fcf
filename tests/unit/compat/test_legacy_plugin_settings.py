"""The one table from the legacy strategy keywords to colossalai 0.5 plugin settings (`tables.plugin_settings`)."""
from __future__ import annotations

import logging

import pytest

from coati_compat.legacy.tables import PLACEMENTS, plugin_settings
from coati_relay.training.plugins import PLUGIN_OPTIONS, resolve_plugin


@pytest.mark.parametrize("policy,expected", [
    ("cuda", {"placement_policy": "static", "offload_param_frac": 0.0, "offload_optim_frac": 0.0}),
    ("cpu", {"placement_policy": "static", "offload_param_frac": 1.0, "offload_optim_frac": 1.0}),
    ("auto", {"placement_policy": "auto"}),
    ("static", {"placement_policy": "static"}),
])
def test_gemini_placements(policy, expected):
    assert plugin_settings("gemini", {"placement_policy": policy, "search_range_m": 32}) == {
        "search_range_m": 32, **expected}


@pytest.mark.parametrize("policy", sorted(PLACEMENTS["gemini"]))
def test_every_gemini_placement_is_a_colossalai_policy(policy):
    """The GPU failure: colossalai 0.5's GeminiManager asserted on the legacy "cuda"."""
    from colossalai.zero.gemini.placement_policy import PlacementPolicyFactory

    settings = plugin_settings("gemini", {"placement_policy": policy})
    assert settings["placement_policy"] in PlacementPolicyFactory.policies
    assert set(settings) <= PLUGIN_OPTIONS["gemini"]


def test_cpu_placement_wins_over_the_default_fractions_beside_it():
    settings = plugin_settings("gemini", {"offload_param_frac": 0.0, "offload_optim_frac": 0.0,
                                          "placement_policy": "cpu"})
    assert settings["offload_param_frac"] == 1.0 and settings["offload_optim_frac"] == 1.0


def test_zero_placements_bucket_size_and_errors():
    legacy = {"stage": 2, "placement_policy": "cpu", "reduce_bucket_size": 12 * 1024 ** 2, "initial_scale": 2 ** 16}
    settings = plugin_settings("zero2", legacy)
    assert settings == {"stage": 2, "cpu_offload": True, "reduce_bucket_size_in_m": 12.0, "initial_scale": 65536}
    assert set(settings) <= PLUGIN_OPTIONS["zero2"]
    assert plugin_settings("zero2", {"placement_policy": "cuda"}) == {"cpu_offload": False}
    with pytest.raises(ValueError, match="placement_policy must be 'cpu' or 'cuda' for plugin 'zero2', got 'auto'"):
        plugin_settings("zero2", {"placement_policy": "auto"})


def test_settings_in_colossalai_terms_pass_through_and_shard_init_is_dropped(caplog):
    settings = plugin_settings("zero2", {"placement_policy": "cuda", "reduce_bucket_size": 2 * 1024 ** 2})
    assert plugin_settings("zero2", settings) == settings
    with caplog.at_level(logging.WARNING):
        assert plugin_settings("gemini", {"shard_init": True, "precision": "fp16"}) == {"precision": "fp16"}
    assert "shard_init=True is ignored" in caplog.text


@pytest.mark.parametrize("cls,kwargs,expected", [
    ("GeminiStrategy", {"placement_policy": "cuda"}, {"placement_policy": "static", "offload_param_frac": 0.0}),
    ("ColossalAIStrategy", {"stage": 3, "placement_policy": "cuda"}, {"placement_policy": "static"}),
    ("ColossalAIStrategy", {"stage": 3, "placement_policy": "cpu"}, {"offload_optim_frac": 1.0}),
    ("LowLevelZeroStrategy", {"placement_policy": "cpu"}, {"cpu_offload": True, "stage": 2}),
])
def test_strategies_resolve_to_valid_plugin_options_on_a_cuda_host(monkeypatch, cls, kwargs, expected):
    """What each strategy hands the engine where CUDA exists (no CPU fallback): options the plugin accepts."""
    from coati_compat.legacy import strategies
    from coati_relay.training import plugins

    monkeypatch.setattr(plugins, "_cuda_available", lambda: True)
    monkeypatch.setattr(strategies._ColossalStrategy, "setup_distributed", lambda self: None)
    strategy = getattr(strategies, cls)(**kwargs)
    assert {k: strategy.plugin_options[k] for k in expected} == expected
    assert resolve_plugin(strategy.plugin_name, strategy.plugin_options, cuda_available=True)[1] == \
        strategy.plugin_options
