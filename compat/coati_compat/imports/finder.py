"""A ``sys.meta_path`` finder that serves the legacy ``coati`` module paths from ``coati_compat``.

It serves only the paths of the deprecation table (``coati.ray.utils`` -> ``coati_compat.legacy.ray_utils``, ...)
and the packages above them (``coati``, ``coati.ray``, ``coati.trainer``, ...). A served legacy module *is* its
target module: ``sys.modules["coati.ray.utils"] is sys.modules["coati_compat.legacy.ray_utils"]``.

Another ``coati`` distribution (ColossalChat's, "V2") may be installed beside it, and keeps working as without
coati-relay:

- a path V2 has is V2's module, executed as usual. Where the table serves the same path (``coati.models``,
  ``coati.models.loss``, ``coati.experience_maker``, ...), the legacy-only names are added to V2's module lazily
  (PEP 562 ``__getattr__``; each warns at the user's line); a name both define (``Experience``, ``PolicyLoss``,
  ``RewardModel``, ...) keeps V2's meaning, unless ``COATI_RELAY_LEGACY_NAMES=1`` asks for the legacy one in this
  process;
- V2's ``coati.ray`` cannot be imported (it needs modules V2 deleted): the legacy ``coati.ray.*`` replace it;
- a legacy-only path (``coati.trainer.strategies``, ``coati.models.gpt``, ``coati.replay_buffer``, ...) is served;
- a V2 module that fails to import (a dependency missing here) is replaced by the legacy module of that path, or by
  an empty package, so legacy paths under it still import; its own names then raise the original ImportError.
  Where the failure comes from a package ColossalChat needs and this host lacks (``loralib``, ``jsonlines``, ...),
  also through V2 modules that failed because another one did, the warning and every name the legacy module lacks
  name that package and the ``pip install`` that fixes it.

Cheap on purpose, since ``install()`` runs at start-up of every interpreter (``coati_relay_legacy.pth``,
`coati_compat.imports.startup`): it
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
from typing import Any, Callable, Optional

ROOT = "coati"
LEGACY_WINS = "coati.ray"  # V2 ships this package, but it cannot be imported there: the legacy one replaces it


class _LegacyPaths:
    """What is served: ``modules`` (legacy path -> target module) and ``packages`` (paths with submodules)."""

    def __init__(self) -> None:
        from coati_compat.imports.deprecations import DEPRECATIONS

        self.modules: dict[str, str] = {k: e.target for k, e in DEPRECATIONS.items() if e.is_module}
        self.names: dict[str, dict[str, str]] = {}  # legacy module -> {name: "target.module:attr"}
        for key, entry in DEPRECATIONS.items():
            if not entry.is_module:
                module, _, name = key.rpartition(".")
                self.names.setdefault(module, {})[name] = entry.target
        self.packages = {ROOT}
        for path in self.modules:
            parts = path.split(".")
            self.packages.update(".".join(parts[:i]) for i in range(1, len(parts)))

    def served(self, fullname: str) -> bool:
        return fullname in self.modules or fullname in self.packages

    @staticmethod
    def legacy_wins(fullname: str) -> bool:
        return fullname == LEGACY_WINS or fullname.startswith(LEGACY_WINS + ".")


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
        from coati_compat.imports.deprecations import warn_deprecated

        warn_deprecated(spec.name)


def _colossalchat_spec(fullname: str) -> Optional[importlib.machinery.ModuleSpec]:
    """The spec of ``fullname`` in another installed ``coati`` (a regular module or package), or None."""
    if fullname == ROOT:
        search = None
    else:
        parent = sys.modules.get(fullname.rpartition(".")[0])
        search = list(getattr(parent, "__path__", None) or [])
        if not search:
            return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, search)
    if spec is None or spec.loader is None or spec.origin in (None, "namespace"):
        return None
    return spec


_MISSING = object()


def _legacy_attribute(fullname: str, name: str) -> Any:
    """The legacy object ``fullname.name`` (warning at the user's line when the table lists it), or _MISSING."""
    paths = legacy_paths()
    target = paths.names.get(fullname, {}).get(name)
    if target is not None:
        module, _, attr = target.partition(":")
        from coati_compat.imports.deprecations import warn_deprecated

        warn_deprecated(f"{fullname}.{name}")
        return getattr(importlib.import_module(module), attr)
    module_target = paths.modules.get(fullname)
    if module_target is not None:
        legacy = importlib.import_module(module_target)
        if name in getattr(legacy, "__all__", ()):
            return getattr(legacy, name)
    return _MISSING


def _legacy_names(fullname: str) -> list[str]:
    paths = legacy_paths()
    names = list(paths.names.get(fullname, {}))
    if fullname in paths.modules:
        names += [n for n in getattr(importlib.import_module(paths.modules[fullname]), "__all__", ()) if n not in names]
    return names


def _add_legacy_names(module: ModuleType, fullname: str) -> None:
    """Gives V2's ``module`` the legacy-only names of ``fullname`` through a module ``__getattr__`` (PEP 562),
    after V2's own; with ``COATI_RELAY_LEGACY_NAMES=1`` (or ``final``) the legacy names replace V2's."""
    own: Optional[Callable[[str], Any]] = module.__dict__.get("__getattr__")

    def __getattr__(name: str) -> Any:
        if not name.startswith("__"):
            value = _legacy_attribute(fullname, name)
            if value is not _MISSING:
                return value
        if own is not None:
            return own(name)
        raise AttributeError(f"module {fullname!r} has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    from coati_compat.imports import legacy_switch

    if legacy_switch.legacy_names():
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            for name in _legacy_names(fullname):
                setattr(module, name, _legacy_attribute(fullname, name))
        if fullname in legacy_paths().modules:
            from coati_compat.imports.deprecations import warn_deprecated

            warn_deprecated(fullname)


# module name (V2's, and that of the legacy module served in its place) -> the package outside ``coati`` whose
# absence made V2's module fail
_missing_packages: dict[str, str] = {}


def _missing_package(error: ImportError) -> Optional[str]:
    """The package ColossalChat needs that ``error`` comes from: the module not found, when it is outside ``coati``,
    or the one that made the module ``error`` names fail (a V2 module importing from a failed one)."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        top = error.name.partition(".")[0]
        if top not in (ROOT, "coati_compat", "coati_relay"):
            return top
    return _missing_packages.get(error.name or "")


def _failure(fullname: str, error: ImportError) -> str:
    package = _missing_package(error)
    if package is None:
        return f"ColossalChat's {fullname} failed to import ({type(error).__name__}: {error})"
    return (f"ColossalChat's {fullname} failed to import: ColossalChat needs the package {package!r}, which is not "
            f"installed here (pip install {package})")


def _raise_on_names(module: ModuleType, fullname: str, error: ImportError) -> None:
    """Makes the names a failed V2 module would have defined raise its original ImportError."""
    def __getattr__(name: str) -> Any:
        if not name.startswith("__"):
            value = _legacy_attribute(fullname, name)
            if value is not _MISSING:
                return value
            raise ImportError(f"cannot import name {name!r} from {fullname!r}: {_failure(fullname, error)}") from error
        raise AttributeError(name)

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]


def _explain_missing_names(legacy: ModuleType, fullname: str, error: ImportError) -> None:
    """Makes a public name that ``legacy`` (served in place of V2's failed ``fullname``) lacks raise an ImportError
    that names the ColossalChat dependency that is missing, instead of a bare "cannot import name"."""
    own: Optional[Callable[[str], Any]] = legacy.__dict__.get("__getattr__")

    def __getattr__(name: str) -> Any:
        if own is not None:
            try:
                return own(name)
            except AttributeError:
                pass
        if name.startswith("_"):
            raise AttributeError(f"module {legacy.__name__!r} has no attribute {name!r}")
        raise ImportError(f"cannot import name {name!r} from {fullname!r}: {_failure(fullname, error)}; coati-relay "
                          f"serves its legacy {fullname} in its place, which has no {name!r}", name=fullname) from error

    legacy.__getattr__ = __getattr__  # type: ignore[attr-defined]


class ColossalChatLoader:
    """Executes V2's module with V2's own loader, then adds the legacy names of the same path (see the module
    docstring); falls back to the legacy module, or an empty package, when V2's module fails to import."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        fullname = module.__spec__.name
        try:
            self.inner.exec_module(module)
        except ImportError as error:
            import logging

            package = _missing_package(error)
            logging.getLogger(__name__).warning("%s; the legacy paths under it are served by coati-relay",
                                                _failure(fullname, error))
            target = legacy_paths().modules.get(fullname)
            if package is not None:
                _missing_packages[fullname] = package
            if target is None:
                _raise_on_names(module, fullname, error)
                return
            legacy = importlib.import_module(target)
            if package is not None:
                _missing_packages[legacy.__name__] = package
                _explain_missing_names(legacy, fullname, error)
            if module.__spec__.submodule_search_locations is not None and not hasattr(legacy, "__path__"):
                legacy.__path__ = list(module.__spec__.submodule_search_locations)  # type: ignore[attr-defined]
            sys.modules[fullname] = legacy  # the import system returns what sys.modules holds after exec
            from coati_compat.imports.deprecations import warn_deprecated

            warn_deprecated(fullname)
            return
        if fullname in legacy_paths().names or fullname in legacy_paths().modules:
            _add_legacy_names(module, fullname)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... of the V2 loader
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class LegacyFinder:
    """Finds the legacy ``coati`` paths of the deprecation table; returns None for everything else."""

    def find_spec(self, fullname: str, path: list[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not (fullname == ROOT or fullname.startswith("coati.")):
            return None
        paths = legacy_paths()
        if not paths.served(fullname):
            return None
        if not paths.legacy_wins(fullname):
            theirs = _colossalchat_spec(fullname)
            if theirs is not None:
                theirs.loader = ColossalChatLoader(theirs.loader)
                return theirs
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

