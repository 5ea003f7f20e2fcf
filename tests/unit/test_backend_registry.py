"""Inference backends and weight syncs come from their registries (`coati_relay.inference.registry`,
`coati_relay.exchange.sync_registry`): a fake backend and a fake sync (tests/unit/fake_backend.py,
tests/unit/fake_weight_sync.py), registered as a user would, are taken by `build_run_config` and run a colocated run
with no other edit; and no module outside the registries compares their names."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.exchange import sync_registry
from coati_relay.inference import registry
from tests.unit import fake_backend, fake_weight_sync
from tests.unit.small_run import small_run_kwargs

ROOT = Path(__file__).resolve().parents[2]
# a backend's or sync's name compared outside the registries' own packages
NAME_TEST = re.compile(r'(inference_backend|weight_sync|backend|kind) *([!=]=|not in) *\(?"(vllm|transformers|'
                       r'collective|object_store)"')
REGISTRY_HOMES = ("coati_relay/inference/", "coati_relay/exchange/", "emitted_colossalchat", "demo.py")


@pytest.fixture
def fakes(monkeypatch):
    """The fake backend and sync registered for one test; the registries as they were afterwards."""
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    monkeypatch.setattr(sync_registry, "_SYNCS", dict(sync_registry._SYNCS))
    registry.register_backend(fake_backend.SPEC)
    sync_registry.register_weight_sync(fake_weight_sync.SPEC)
    fake_backend.BUILT.clear()
    fake_weight_sync.PUBLISHED.clear()


def fake_run(tmp_path, model: str, **over):
    """The small run's keywords with the fakes, the fake backend's own engine key and plugin ddp; ``over`` wins."""
    return small_run_kwargs(tmp_path, model, **{
        "inference_backend": "fake", "weight_sync": "fake_sync", "plugin_config": {"plugin": "ddp"},
        "inference_model_config": {"path": model, "label": "from-config"}, **over})


def test_unregistered_names_are_refused_naming_the_registered_ones(tiny_model_path, tmp_path):
    with pytest.raises(ConfigError) as err:
        build_run_config(**fake_run(tmp_path, tiny_model_path))
    assert "inference_backend must be one of ['vllm', 'transformers'], got 'fake'" in str(err.value)
    assert "weight_sync must be 'object_store' or 'collective', got 'fake_sync'" in str(err.value)


def test_the_config_takes_a_registered_backend_and_sync_with_the_backends_own_keys(fakes, tiny_model_path,
                                                                                   tmp_path):
    cfg = build_run_config(**fake_run(tmp_path, tiny_model_path, colocate=True))
    assert (cfg.roles.inference_backend, cfg.roles.weight_sync, cfg.roles.colocate) == ("fake", "fake_sync", True)
    assert cfg.models.inference_model_kwargs == {"label": "from-config"}
    with pytest.raises(ConfigError, match=r"no key 'fused_decode' for inference_backend='fake'.*\['label', 'path'\]"):
        build_run_config(**fake_run(tmp_path, tiny_model_path, inference_model_config={
            "path": tiny_model_path, "fused_decode": True}))


@pytest.mark.slow
def test_a_colocated_run_builds_the_registered_backend_and_publishes_through_the_registered_sync(
        fakes, tiny_model_path, tmp_path):
    from coati_relay import launch_distributed

    result = launch_distributed(**fake_run(tmp_path, tiny_model_path, colocate=True, progress=False))
    assert [h["version"] for h in result.history] == [1, 2]
    assert [built["label"] for built in fake_backend.BUILT] == ["from-config"], "one engine, from the fake's spec"
    assert fake_weight_sync.PUBLISHED == [1, 2], "each trained version went through the fake sync's publisher"


def test_no_module_outside_the_registries_compares_a_backends_or_syncs_name():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for folder in ("backend", "compat") for path in sorted((ROOT / folder).rglob("*.py"))
             if not any(home in path.as_posix() for home in REGISTRY_HOMES)
             for n, line in enumerate(path.read_text().splitlines(), 1) if NAME_TEST.search(line)]
    assert found == [], "ask the spec (inference.backend_spec, exchange.sync_registry.weight_sync_spec) instead"
