"""coati-relay's engine: vLLM producers, ColossalAI consumers, Ray in between.

Entry point: `launch_distributed(...)` with ColossalChat's keywords (plus ``core_algo="PPO"``); it returns a
`RunResult`. Imports are lazy so that `import coati_relay` stays cheap.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["launch_distributed", "RunResult", "RunFailed", "ConfigError", "build_run_config"]


def __getattr__(name: str) -> Any:
    if name in ("launch_distributed", "RunResult", "RunFailed"):
        from coati_relay import launch

        return getattr(launch, name)
    if name in ("ConfigError", "build_run_config"):
        from coati_relay import config

        return getattr(config, name)
    raise AttributeError(f"module 'coati_relay' has no attribute {name!r}")
