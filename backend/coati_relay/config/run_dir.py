"""Where a run writes: a run that starts afresh gets a run directory of its own.

A run directory holds one run's ``metrics.jsonl`` (continued only by a resumed run) and, unless ``save_dir`` says
otherwise, its ``checkpoints/``. A fresh run that wrote into an earlier run's directory would append its steps to
the earlier ones, and its summary, plots and export would describe both runs as one.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import List

from coati_relay.checkpoint import list_checkpoints

METRICS_FILE = "metrics.jsonl"  # a run's records, in its run directory

logger = logging.getLogger(__name__)


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds an earlier run's records: a non-empty ``metrics.jsonl`` or a checkpoint."""
    metrics = Path(run_dir) / METRICS_FILE
    return (metrics.is_file() and metrics.stat().st_size > 0) or bool(list_checkpoints(run_dir))


def default_run_dir(base: Path, fresh: bool) -> Path:
    """``base`` (``runs/NAME``), or for a fresh run where ``base`` holds an earlier run the first of ``base-2``,
    ``base-3``, ... that holds none (logged); a resumed run continues in ``base``."""
    if not fresh or not holds_run(base):
        return base
    k = 2
    while holds_run(chosen := base.with_name(f"{base.name}-{k}")):
        k += 1
    logger.warning("%s holds an earlier run; this run writes to %s (pass run_dir to choose the directory, or "
                   "resume_from to continue the earlier run)", base, chosen)
    return chosen


def check_given_run_dir(errors: List[str], run_dir: Path, fresh: bool) -> None:
    """A fresh run refuses a given ``run_dir`` that holds an earlier run (appended to ``errors``)."""
    if fresh and holds_run(run_dir):
        errors.append(f"run_dir={str(run_dir)!r} holds an earlier run ({METRICS_FILE} or checkpoints); pass "
                      f"resume_from={str(run_dir)!r} to continue it, or a new or empty run_dir (left out, the run "
                      f"writes to runs/PROJECT, or runs/PROJECT-2, ... where that holds a run)")
