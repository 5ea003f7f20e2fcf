"""Observers of legacy runs: callbacks that a tool on top of the legacy layer adds to every legacy trainer and maker
of a run, without the legacy layer importing the tool (``coati-relay compare`` records a legacy run this way).

``$COATI_RELAY_LEGACY_OBSERVERS`` names modules, comma-separated. Each provides ``trainer_callbacks() -> list`` of
``TrainerCallback`` and ``maker_callbacks(experience_maker) -> list`` of ``MakerCallback``. It is a variable of the
environment so that every process of the run, Ray workers included, inherits it. Imports nothing heavy.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, List

ENV = "COATI_RELAY_LEGACY_OBSERVERS"


def _observer_modules() -> List[ModuleType]:
    modules = []
    for name in filter(None, (part.strip() for part in os.environ.get(ENV, "").split(","))):
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            raise ImportError(f"${ENV} names {name!r}, which cannot be imported ({exc}); unset {ENV} or install "
                              "the package that provides it") from exc
    return modules


def trainer_observers() -> List[Any]:
    """The callbacks every observer module adds to a legacy trainer ([] when ``$COATI_RELAY_LEGACY_OBSERVERS`` is
    unset)."""
    return [callback for module in _observer_modules() for callback in module.trainer_callbacks()]


def maker_observers(experience_maker: Any) -> List[Any]:
    """The callbacks every observer module adds to a legacy maker whose experience maker is ``experience_maker``."""
    return [callback for module in _observer_modules() for callback in module.maker_callbacks(experience_maker)]
