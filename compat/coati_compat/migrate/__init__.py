"""The migration rewriter: turns a legacy ``coati.ray`` launch script into a ``coati_relay.launch_distributed``
script (and a YAML config for ``coati-relay run``).

    python -m coati_compat.migrate mmmt_prompt.py -o mmmt_prompt_relay.py --yaml mmmt_prompt.yaml

The legacy script is read with `ast`, never run. See ``migration_guide/rewriter.md`` for the mapping it applies.
"""
from __future__ import annotations

from coati_compat.migrate.analyze import LegacyScript, analyze_file, analyze_source
from coati_compat.migrate.rewrite import Migration, migrate_file, migrate_source

__all__ = ["Migration", "migrate_file", "migrate_source", "LegacyScript", "analyze_file", "analyze_source"]
