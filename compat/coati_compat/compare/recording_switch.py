"""Whether a compare run records, and where: ``$COATI_RELAY_COMPARE_EVENTS`` names the directory (the compare run
sets it; Ray workers inherit it). Imports nothing heavy: Ray workers read it in their setup hook."""
from __future__ import annotations

import os
from typing import Dict, Optional

from coati_compat import observers

ENV = "COATI_RELAY_COMPARE_EVENTS"
RECORDER = "coati_compat.compare.recording"  # the shims' trainers and makers take its callbacks as observers


def recording_env(directory: str) -> Dict[str, str]:
    """The variables that turn recording on in a legacy run and its Ray workers: the records' directory, and the
    recorder as an observer of every legacy trainer and maker (`coati_compat.observers`)."""
    return {ENV: directory, observers.ENV: RECORDER}


def events_dir() -> Optional[str]:
    """The directory of ``$COATI_RELAY_COMPARE_EVENTS``, or None when recording is off."""
    return os.environ.get(ENV) or None
