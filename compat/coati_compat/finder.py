"""A ``sys.meta_path`` finder that serves the legacy ``coati`` module paths from ``coati_compat``.

It serves only the paths of the deprecation table (``coati.ray.utils`` -> ``coati_compat.legacy.ray_utils``, ...)
and the packages above them (``coati``, ``coati.ray``, ``coati.trainer``, ...). A served legacy module *is* its
target module: ``sys.modules["coati.ray.utils"] is sys.modules["coati_compat.legacy.ray_utils"]``.

Another ``coati`` distribution (ColossalChat's) may be installed beside it. Its directories go into the
``__path__`` of the served packages, so every path the table does not name (``coati.distributed``,
``coati.dataset``, ...) is imported from it by the ordinary path finder, while its broken ``coati.ray`` and the
other legacy paths are shadowed. The ColossalChat ``coati/__init__.py`` is not executed.

Cheap on purpose, since ``install()`` runs at start-up of every interpreter (``coati_relay_legacy.pth``): it
imports only modules the interpreter has already loaded (the finder and loader follow the import protocols without
``importlib.abc``); the deprecation table is read at the first ``coati`` import, torch comes with the first legacy
module.
"""
from __future__ import annotations

import _thread
import importlib
import importlib.machinery
import os
import sys
from types import ModuleType

ROOT = "coati"


class _LegacyPaths:
    """What is served: ``modules`` (legacy path -> target module) and ``packages`` (paths with submodules)."""

    def __init__(self) -> None:
        from coati_compat.deprecations import DEPRECATIONS

        self.modules: dict[str, str] = {k: e.target for k, e in DEPRECATIONS.items() if e.is_module}
        self.packages = {ROOT}
        for path in self.modules:
            parts = path.split(".")
            self.packages.update(".".join(parts[:i]) for i in range(1, len(parts)))

    def served(self, fullname: str) -> bool:
        return fullname in self.modules or fullname in self.packages


_paths: _LegacyPaths | None = None
_paths_lock = _thread.allocate_lock()


def legacy_paths() -> _LegacyPaths:
    global _paths
    if _paths is None:
        with _paths_lock:
            if _paths is None:
                _paths = _LegacyPaths()
    return _paths


def _other_locations(fullname: str) -> list[str]:
    """Directories of ``fullname`` (a package) in other installed distributions: the ``__path__`` to search."""
    if fullname == ROOT:
        found = []
        for entry in sys.path:
            if not isinstance(entry, str):
                continue
            directory = os.path.join(entry or os.getcwd(), ROOT)
            if os.path.isdir(directory) and directory not in found:
                found.append(directory)
        return found
    parent_name, _, last = fullname.rpartition(".")
    parent = sys.modules.get(parent_name)
    parent_path = getattr(parent, "__path__", None) or []
    return [os.path.join(d, last) for d in parent_path if os.path.isdir(os.path.join(d, last))]


class LegacyLoader:
    """Loads a served path: the target module itself (module entries) or an empty package (the packages above)."""

    def __init__(self, target: str | None) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        if self.target is None:
            return None
        module = importlib.import_module(self.target)
        spec.loader_state = {"target_spec": module.__spec__}
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if self.target is None:
            module.__doc__ = f"Legacy package {spec.name}, served by coati_compat."
            return
        # import machinery set __spec__ to the legacy spec on the shared object: give the target its own back.
        module.__spec__ = spec.loader_state["target_spec"]
        from coati_compat.deprecations import warn_deprecated

        warn_deprecated(spec.name)


class LegacyFinder:
    """Finds the legacy ``coati`` paths of the deprecation table; returns None for everything else."""

    def find_spec(self, fullname: str, path: list[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not (fullname == ROOT or fullname.startswith("coati.")):
            return None
        paths = legacy_paths()
        if not paths.served(fullname):
            return None
        is_package = fullname in paths.packages
        spec = importlib.machinery.ModuleSpec(fullname, LegacyLoader(paths.modules.get(fullname)),
                                              is_package=is_package)
        if is_package:
            spec.submodule_search_locations = _other_locations(fullname)
        return spec


def install() -> LegacyFinder:
    """Puts the finder first on ``sys.meta_path`` (idempotent) and returns it."""
    for finder in sys.meta_path:
        if isinstance(finder, LegacyFinder):
            return finder
    finder = LegacyFinder()
    sys.meta_path.insert(0, finder)
    return finder

