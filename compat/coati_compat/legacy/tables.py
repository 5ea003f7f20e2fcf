"""Legacy names and defaults that the served API and the rewriter share (torch-free, so the rewriter stays light).

``LEGACY_STRATEGIES`` is the one table of the legacy ``--trainer_strategy`` choices: the strategy class each built,
with its keywords (``coati.ray.utils.get_strategy_from_args``). `legacy_options` and `plugin_settings` map a strategy
class and its keywords onto an engine plugin and its colossalai 0.5 settings: the strategies use them, and
`class_plugin_config` / `plugin_config` give migrated scripts the same settings as ``plugin_config``. ``LEGACY_LR``
is the learning rate the legacy PPO trainer gave both optimizers.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

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
# Legacy values that mean "off", the plugins' own default: left out (max_norm 0: no gradient clipping).
OFF = {"max_norm": 0.0}
# The fp16 loss-scale keywords (the same names in the plugins and in the engine's fp32 master weights).
LOSS_SCALE_KEYS = ("initial_scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis",
                   "min_scale", "max_scale")


def plugin_settings(plugin: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """The colossalai 0.5 options of ``plugin`` ("zero2", "gemini") for a legacy strategy's keywords: placement
    through `PLACEMENTS` (its settings win over the same keys given beside it), `RENAMED` keys converted, `DROPPED`
    keys logged and left out, `OFF` values left out, every other key as it is (so settings already in colossalai's
    terms pass through)."""
    out: Dict[str, Any] = {}
    for key, value in options.items():
        if key in RENAMED:
            name, factor = RENAMED[key]
            out[name] = value * factor
        elif key in DROPPED:
            if value:
                logger.warning("%s=%r is ignored: %s", key, value, DROPPED[key])
        elif key != "placement_policy" and not (key in OFF and value == OFF[key]):
            out[key] = value
    if "placement_policy" in options:
        table = PLACEMENTS.get(plugin, {})
        policy = options["placement_policy"]
        if policy not in table:
            raise ValueError(f"placement_policy must be {' or '.join(repr(p) for p in sorted(table))} for plugin "
                             f"{plugin!r}, got {policy!r}")
        out.update(table[policy])
    return out


_SCALE_AND_CLIP = {"initial_scale": 2 ** 16, "growth_factor": 2, "backoff_factor": 0.5, "growth_interval": 1000,
                   "hysteresis": 2, "min_scale": 1, "max_scale": 2 ** 32, "max_norm": 0.0, "norm_type": 2.0}
_ZERO = {"reduce_bucket_size": 12 * 1024 ** 2, "overlap_communication": True}
_GEMINI = {"shard_init": False, "pin_memory": True, "force_outputs_fp32": False, "hidden_dim": None,
           "gpu_margin_mem_ratio": 0.0}
# The keyword defaults of the legacy strategy classes that reach a plugin (a test checks them against the classes).
STRATEGY_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "NaiveStrategy": {}, "DDPStrategy": {},
    "LowLevelZeroStrategy": {"stage": 2, "precision": LEGACY_PRECISION, "placement_policy": "cuda", **_ZERO,
                             **_SCALE_AND_CLIP},
    "GeminiStrategy": {"placement_policy": "auto", "shard_param_frac": 1.0, "offload_optim_frac": 0.0,
                       "offload_param_frac": 0.0, "search_range_m": 32, "min_chunk_size_m": 32, **_GEMINI,
                       **_SCALE_AND_CLIP},
    "ColossalAIStrategy": {"stage": 3, "precision": LEGACY_PRECISION, "placement_policy": "cuda",
                           "search_range_mb": 32, "min_chunk_size_mb": 32, **_GEMINI, **_ZERO, **_SCALE_AND_CLIP},
}
_ZERO_KEYS = ("stage", "precision", "placement_policy", *_ZERO, *_SCALE_AND_CLIP)
_NOT_GEMINI = ("stage", *_ZERO)


def legacy_options(cls: str, options: Mapping[str, Any]) -> Tuple[Optional[str], Dict[str, Any]]:
    """``(plugin, options)`` of legacy strategy class ``cls`` built with keywords ``options`` (its defaults for the
    rest): ZeRO's options already in plugin terms, Gemini's with the legacy keywords (fp16, as the legacy code
    forced); `plugin_settings` maps both. ``ColossalAIStrategy``: stage 3 is Gemini, 1 and 2 LowLevelZero. Raises
    ValueError where the legacy class asserted."""
    if cls not in STRATEGY_DEFAULTS:
        raise ValueError(f"unknown legacy strategy class {cls!r}; use one of {sorted(STRATEGY_DEFAULTS)}")
    unknown = sorted(set(options) - set(STRATEGY_DEFAULTS[cls]))
    if unknown:
        raise ValueError(f"{cls} has no plugin keywords {unknown}; known: {sorted(STRATEGY_DEFAULTS[cls])}")
    opts = {**STRATEGY_DEFAULTS[cls], **options}
    if cls == "ColossalAIStrategy":
        if opts["stage"] not in (1, 2, 3):
            raise ValueError(f"ColossalAIStrategy: stage must be 1, 2 or 3, got {opts['stage']!r}")
        if opts["precision"] not in ("fp32", "fp16"):
            raise ValueError(f"ColossalAIStrategy: precision must be 'fp32' or 'fp16', got {opts['precision']!r}")
        if opts["stage"] == 3 and opts["placement_policy"] not in ("cpu", "cuda"):
            raise ValueError(f"placement_policy must be 'cpu' or 'cuda', got {opts['placement_policy']!r}")
        cls = "GeminiStrategy" if opts["stage"] == 3 else "LowLevelZeroStrategy"
        opts["search_range_m"], opts["min_chunk_size_m"] = opts.pop("search_range_mb"), opts.pop("min_chunk_size_mb")
    if cls == "LowLevelZeroStrategy":
        return CLASS_PLUGINS[cls], plugin_settings("zero2", {k: opts[k] for k in _ZERO_KEYS})
    if cls == "GeminiStrategy":
        return CLASS_PLUGINS[cls], {**{k: v for k, v in opts.items() if k not in _NOT_GEMINI},
                                    "precision": LEGACY_PRECISION}
    return (None if cls == "NaiveStrategy" else CLASS_PLUGINS[cls]), {}


def class_plugin_config(cls: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """The engine ``plugin_config`` that trains as ``cls(**options)`` did: the plugin and settings the strategy
    itself picks (`legacy_options`, `plugin_settings`); the naive strategy trains as ``"ddp"``."""
    plugin, settings = legacy_options(cls, options)
    return {"plugin": plugin or "ddp", **(plugin_settings(plugin, settings) if plugin else {})}


def legacy_strategy(name: str) -> LegacyStrategy:
    """The table entry of a legacy strategy name; an unknown name raises ValueError listing the known ones."""
    if name not in LEGACY_STRATEGIES:
        raise ValueError(f"unknown legacy trainer strategy {name!r}; use one of {sorted(LEGACY_STRATEGIES)}")
    return LEGACY_STRATEGIES[name]


def plugin_config(name: str) -> Dict[str, Any]:
    """The engine ``plugin_config`` that trains as legacy ``--trainer_strategy`` ``name`` did."""
    entry = legacy_strategy(name)
    return class_plugin_config(entry.cls, entry.options)
