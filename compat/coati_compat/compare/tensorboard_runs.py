"""``coati-relay compare --tensorboard DIR``: both sides of a report as TensorBoard runs, ``DIR/legacy-N`` (one per
legacy run) and ``DIR/migrated``, so that ``tensorboard --logdir DIR`` draws their curves on one chart per quantity.

Each run holds the report's per-step rows (`coati_compat.compare.steps`): one scalar per quantity (``reward``,
``kl``, ``actor_loss``, ``critic_loss``, ``step_s``, ``samples_per_s``, ``push_s``, ...) at its step, a missing
value left out; and the script, its arguments and the side as text.
"""
from __future__ import annotations

import importlib.util
import logging
import math
import shutil
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

logger = logging.getLogger(__name__)


def check_available() -> None:
    """Raises ImportError with the fix when the tensorboard package is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ImportError("--tensorboard needs the tensorboard package: pip install tensorboard")


def side_runs(comparison: Dict[str, Any]) -> List[Tuple[str, Sequence[Dict[str, Any]]]]:
    """(run name, rows) of each side of a comparison (as ``compare.json`` holds it): the legacy runs, then the
    migrated run when it ran."""
    runs = [(f"legacy-{i}", run["rows"]) for i, run in enumerate(comparison["legacy"], start=1)]
    if comparison.get("migrated"):
        runs.append(("migrated", comparison["migrated"]["rows"]))
    return runs


def _numbers(row: Dict[str, Any]) -> Dict[str, float]:
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def write_runs(comparison: Dict[str, Any], directory: Path) -> List[Path]:
    """Writes each side's rows as a TensorBoard run under ``directory`` (an earlier report's run of the same name is
    replaced, so that its steps do not mix in); returns the runs' directories."""
    from coati_relay.parts import TensorBoardTracker

    written = []
    for name, rows in side_runs(comparison):
        run_dir = Path(directory) / name
        shutil.rmtree(run_dir, ignore_errors=True)
        tracker = TensorBoardTracker(run_dir)
        try:
            tracker.log_config({"side": name, "script": comparison["script"], "args": comparison["args"]})
            for row in rows:
                tracker.log(int(row["step"]), _numbers(row))
        finally:
            tracker.close()
        written.append(run_dir)
    logger.info("compare: TensorBoard runs %s; view them with `tensorboard --logdir %s`",
                [p.name for p in written], directory)
    return written
