"""Where ``coati_relay.migration.from_legacy.LEGACY_STRATEGY_PLUGINS`` (what migrated scripts import) comes from:
each legacy ``--trainer_strategy`` of the one table (`coati_compat.legacy.tables`) as a plugin_config without the
settings its plugin picks anyway. A test checks that the engine's table is `strategy_plugins()`.
"""
from __future__ import annotations

from typing import Any, Dict

from coati_compat.legacy.tables import LEGACY_STRATEGIES, plugin_config
from coati_relay.parts import PLUGINS

# colossalai 0.5's constructor defaults of the options the legacy strategies set (a test checks them against the
# installed colossalai): what a plugin_config that leaves such an option out trains with.
COLOSSALAI_DEFAULTS = {
    "zero2": {"stage": 1, "precision": "fp16", "initial_scale": 2 ** 32, "growth_factor": 2, "backoff_factor": 0.5,
              "growth_interval": 1000, "hysteresis": 2, "min_scale": 1, "max_scale": 2 ** 32, "norm_type": 2.0,
              "reduce_bucket_size_in_m": 12, "overlap_communication": True, "cpu_offload": False},
    "gemini": {"precision": "fp16", "placement_policy": "static", "shard_param_frac": 1.0, "offload_optim_frac": 0.0,
               "offload_param_frac": 0.0, "search_range_m": 32, "min_chunk_size_m": 32, "pin_memory": False,
               "force_outputs_fp32": False, "hidden_dim": None, "gpu_margin_mem_ratio": 0.0,
               "initial_scale": 2 ** 16, "growth_factor": 2, "backoff_factor": 0.5, "growth_interval": 1000,
               "hysteresis": 2, "min_scale": 1, "max_scale": 2 ** 32, "norm_type": 2.0},
}


def beyond_defaults(config: Dict[str, Any]) -> Dict[str, Any]:
    """``config`` (a plugin_config) without the settings its plugin gets anyway: those equal to the engine's plugin
    defaults or, where the engine sets none, to colossalai's."""
    plugin = config["plugin"]
    defaults = {**COLOSSALAI_DEFAULTS.get(plugin, {}), **PLUGINS[plugin].defaults}
    return {k: v for k, v in config.items() if k == "plugin" or k not in defaults or defaults[k] != v}


def strategy_plugins() -> Dict[str, Dict[str, Any]]:
    """Legacy --trainer_strategy -> the plugin_config a migrated script trains with."""
    return {name: beyond_defaults(plugin_config(name)) for name in LEGACY_STRATEGIES}
