"""The migration rewriter: turns a legacy ``coati.ray`` launch script into a ``coati_relay.launch_distributed``
script (and a YAML config for ``coati-relay run``).

    coati-relay migrate mmmt_prompt.py -o mmmt_prompt_relay.py --yaml mmmt_prompt.yaml

(or ``python -m coati_compat.migrate ...``). The legacy script is read with `ast`, never run; the migrated script
imports its helpers from `coati_relay.migration.from_legacy`. See ``migration_guide/rewriter.md`` (``coati-relay docs
rewriter``) for the mapping it applies.
"""
from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: the rewriter pulls in transformers (the legacy tables), and `coati-relay --help` imports
# this package to list the subcommand.
_HOMES = {"Migration": "rewrite", "migrate_file": "rewrite", "migrate_source": "rewrite",
          "LegacyScript": "analyze", "analyze_file": "analyze", "analyze_source": "analyze"}

__all__ = ["Migration", "migrate_file", "migrate_source", "LegacyScript", "analyze_file", "analyze_source"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
