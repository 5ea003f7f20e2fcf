"""`start_local_ray`: the Ray cluster a run starts for itself when none is running.

Such a cluster runs without Ray's dashboard and without Ray's metrics. Ray's metrics recording grew the driver, the
rollout queue and the weight store by about 1 KiB a round each in the toy soak (Ray 2.60, measured with
`benchmarks/memory_soak.py`), which a multi-day run pays in each of them. ``RAY_enable_metrics_collection``
set in the environment (``1`` to keep them) is followed instead. A cluster started beforehand (``ray start``,
``RAY_ADDRESS``) keeps its own settings: start it with ``RAY_enable_metrics_collection=0`` for the same effect.
"""
from __future__ import annotations

import os
from typing import Any, Dict

METRICS_ENV = "RAY_enable_metrics_collection"


def local_system_config() -> Dict[str, Any]:
    """Ray's ``_system_config`` of a cluster started here: metrics off unless ``$RAY_enable_metrics_collection``
    says otherwise (then Ray reads the variable itself)."""
    return {} if METRICS_ENV in os.environ else {"enable_metrics_collection": False}


def start_local_ray(**kwargs: Any) -> None:
    """``ray.init(**kwargs)`` without dashboard, driver logs or metrics (keywords given override these)."""
    import ray

    ray.init(**{"include_dashboard": False, "log_to_driver": False, "_system_config": local_system_config(),
                **kwargs})
