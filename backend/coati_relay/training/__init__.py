"""Consumer-side training: the `TrainingBackend` (ColossalAI Booster), its plugin table, the data-parallel process
group and the PPO critic. Names load lazily, so that `coati_relay.training.plugins` stays free of colossalai."""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainingBackend": "booster_backend", "load_causal_lm": "booster_backend",
    "CriticModel": "critic",
    "init_process_group": "distributed", "free_port": "distributed",
    "PLUGINS": "plugins", "resolve_plugin": "plugins", "build_plugin": "plugins",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'coati_relay.training' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
