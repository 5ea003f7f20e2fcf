"""Legacy names and defaults that the served API and the rewriter share (torch-free, so the rewriter stays light).

``LEGACY_STRATEGIES`` is the one table of the legacy ``--trainer_strategy`` choices: the strategy class each built,
with its keywords (``coati.ray.utils.get_strategy_from_args``), and ``plugin_config`` turns an entry into the
engine's ``plugin_config`` (what migrated scripts get). ``LEGACY_LR`` is the learning rate the legacy PPO trainer
gave both optimizers.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, NamedTuple

logger = logging.getLogger(__name__)

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

# THE table from legacy strategy keywords to colossalai 0.5 plugin settings (`plugin_settings` applies it).
# placement_policy per plugin: colossalai 0.5's Gemini knows only "static" and "auto"; the legacy "cuda" (everything
# on the GPU) is static with nothing offloaded, "cpu" static with parameters and optimizer states offloaded.
# LowLevelZero has no placement: "cpu" is its CPU offload.
PLACEMENTS: Dict[str, Dict[str, Dict[str, Any]]] = {
    "zero2": {"cuda": {"cpu_offload": False}, "cpu": {"cpu_offload": True}},
    "gemini": {"cuda": {"placement_policy": "static", "offload_param_frac": 0.0, "offload_optim_frac": 0.0},
               "cpu": {"placement_policy": "static", "offload_param_frac": 1.0, "offload_optim_frac": 1.0},
               "static": {"placement_policy": "static"},
               "auto": {"placement_policy": "auto"}},
}
# Legacy keyword -> (plugin option, factor): the legacy bucket size counted bytes, the plugin's counts MiB.
RENAMED = {"reduce_bucket_size": ("reduce_bucket_size_in_m", 1 / 1024 ** 2)}
# Legacy keywords without a plugin setting, and what to do instead.
DROPPED = {"shard_init": "load weights before strategy.prepare()"}
# The fp16 loss-scale keywords (the same names in the plugins and in the engine's fp32 master weights).
LOSS_SCALE_KEYS = ("initial_scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis",
                   "min_scale", "max_scale")


def plugin_settings(plugin: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """The colossalai 0.5 options of ``plugin`` ("zero2", "gemini") for a legacy strategy's keywords: placement
    through `PLACEMENTS` (its settings win over the same keys given beside it), `RENAMED` keys converted, `DROPPED`
    keys logged and left out, every other key as it is (so settings already in colossalai's terms pass through)."""
    out: Dict[str, Any] = {}
    for key, value in options.items():
        if key in RENAMED:
            name, factor = RENAMED[key]
            out[name] = value * factor
        elif key in DROPPED:
            if value:
                logger.warning("%s=%r is ignored: %s", key, value, DROPPED[key])
        elif key != "placement_policy":
            out[key] = value
    if "placement_policy" in options:
        table = PLACEMENTS.get(plugin, {})
        policy = options["placement_policy"]
        if policy not in table:
            raise ValueError(f"placement_policy must be {' or '.join(repr(p) for p in sorted(table))} for plugin "
                             f"{plugin!r}, got {policy!r}")
        out.update(table[policy])
    return out


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
