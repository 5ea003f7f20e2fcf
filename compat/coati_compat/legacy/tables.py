"""Legacy names and defaults that the served API and the rewriter share (torch-free, so the rewriter stays light).

``LEGACY_STRATEGIES`` is the one table of the legacy ``--trainer_strategy`` choices: the strategy class each built,
with its keywords (``coati.ray.utils.get_strategy_from_args``), and ``plugin_config`` turns an entry into the
engine's ``plugin_config`` (what migrated scripts get). ``LEGACY_LR`` is the learning rate the legacy PPO trainer
gave both optimizers.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, NamedTuple

LEGACY_LR = 1e-7

# The ColossalAI strategies trained in fp16 with a dynamic loss scale.
LEGACY_PRECISION = "fp16"

# Strategy class -> engine plugin ("naive" wrapped nothing; with one consumer it trains as "ddp" does).
CLASS_PLUGINS = {"NaiveStrategy": "ddp", "DDPStrategy": "ddp", "LowLevelZeroStrategy": "zero2",
                 "GeminiStrategy": "gemini"}


class LegacyStrategy(NamedTuple):
    cls: str
    options: Mapping[str, Any]


LEGACY_STRATEGIES: Dict[str, LegacyStrategy] = {
    "naive": LegacyStrategy("NaiveStrategy", {}),
    "ddp": LegacyStrategy("DDPStrategy", {}),
    "colossalai_gemini": LegacyStrategy("GeminiStrategy", {"placement_policy": "static", "initial_scale": 2 ** 5}),
    "colossalai_zero2": LegacyStrategy("LowLevelZeroStrategy", {"stage": 2, "placement_policy": "cuda"}),
    "colossalai_gemini_cpu": LegacyStrategy("GeminiStrategy", {
        "placement_policy": "static", "offload_optim_frac": 1.0, "offload_param_frac": 1.0, "initial_scale": 2 ** 5}),
    "colossalai_zero2_cpu": LegacyStrategy("LowLevelZeroStrategy", {"stage": 2, "placement_policy": "cpu"}),
}

# Strategy keywords that carry over to the plugin under the same name.
_PLUGIN_KEYS = ("initial_scale", "offload_optim_frac", "offload_param_frac")


def legacy_strategy(name: str) -> LegacyStrategy:
    """The table entry of a legacy strategy name; an unknown name raises ValueError listing the known ones."""
    if name not in LEGACY_STRATEGIES:
        raise ValueError(f"unknown legacy trainer strategy {name!r}; use one of {sorted(LEGACY_STRATEGIES)}")
    return LEGACY_STRATEGIES[name]


def plugin_config(name: str) -> Dict[str, Any]:
    """The engine ``plugin_config`` that trains as legacy strategy ``name`` did (ZeRO/Gemini: fp16, offloads)."""
    entry = legacy_strategy(name)
    plugin = CLASS_PLUGINS[entry.cls]
    config: Dict[str, Any] = {"plugin": plugin}
    if plugin != "ddp":
        config["precision"] = LEGACY_PRECISION
    config.update({k: entry.options[k] for k in _PLUGIN_KEYS if k in entry.options})
    if entry.options.get("placement_policy") == "cpu":
        config["cpu_offload"] = True
    return config
