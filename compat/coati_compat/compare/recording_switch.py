"""Whether a compare run records, and where: ``$COATI_RELAY_COMPARE_EVENTS`` names the directory (the compare run
sets it; Ray workers inherit it). Imports nothing heavy: Ray workers read it in their setup hook."""
from __future__ import annotations

import os
from typing import Optional

ENV = "COATI_RELAY_COMPARE_EVENTS"


def events_dir() -> Optional[str]:
    """The directory of ``$COATI_RELAY_COMPARE_EVENTS``, or None when recording is off."""
    return os.environ.get(ENV) or None
