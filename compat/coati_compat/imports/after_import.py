"""Patches that run right after a module is first imported (or at once when it is imported already), so that code
which only prepares a process (an interpreter start-up line, a Ray worker's setup hook) imports nothing heavy itself:
importing torch there, for one, fixes its thread count before Ray sets ``OMP_NUM_THREADS`` for the actor."""
from __future__ import annotations

import importlib.machinery
import logging
import sys
import threading
from typing import Any, Callable, Dict

logger = logging.getLogger(__name__)


class AfterImport:
    """A ``sys.meta_path`` entry that runs ``patches[name]()`` right after module ``name`` is first imported.

    ``what`` names the feature in the log when a patch fails: the user's import goes on, unpatched."""

    def __init__(self, patches: Dict[str, Callable[[], Any]], what: str) -> None:
        self.patches, self.what = patches, what
        self._busy = threading.local()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.patches or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None:
            return None
        exec_module, patch = spec.loader.exec_module, self.patches[name]

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            try:
                patch()
            except Exception:  # the user's import must not fail for the feature; say why it is off
                logger.exception("%s: patching %s failed; it is off for that module in this process", self.what, name)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def patch_after_import(patches: Dict[str, Callable[[], Any]], what: str) -> None:
    """Runs each patch now if its module is imported already, else right after its first import. One finder per
    ``what`` and process: a later call replaces its patches."""
    for name, patch in patches.items():
        if name in sys.modules:
            patch()
    finder = next((f for f in sys.meta_path if isinstance(f, AfterImport) and f.what == what), None)
    if finder is None:
        sys.meta_path.insert(0, AfterImport(patches, what))
    else:
        finder.patches = patches
