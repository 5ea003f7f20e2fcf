"""What every interpreter of the environment runs at start-up (the ``coati_relay_legacy.pth`` line calls `run`).

Cheap on purpose: it imports only the finder (no torch), and CPU mode's patches only when ``$COATI_RELAY_CPU_MODE``
is set.
"""
from __future__ import annotations

import os


def run() -> None:
    """Installs the legacy import finder and, when ``$COATI_RELAY_CPU_MODE`` is set, CPU mode
    (`coati_compat.cpu_mode.patches.install`: GPU-era scripts on CPU, in every process)."""
    from coati_compat.imports import finder

    finder.install()
    if os.environ.get("COATI_RELAY_CPU_MODE"):
        from coati_compat.cpu_mode import patches

        patches.install()
