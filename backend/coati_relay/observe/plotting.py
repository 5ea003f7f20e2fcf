"""PNG plots of runs' metrics, drawn with matplotlib's Agg canvas (no display, no global pyplot state)."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import List, Optional, Sequence, Union

from coati_relay.observe.metrics import metrics_path, read_metrics

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]


def plot_run(run_dir_or_dirs: Union[PathLike, Sequence[PathLike]], out_png: Optional[PathLike] = None,
             keys: Sequence[str] = ("reward", "loss")) -> Path:
    """Plots each metric in ``keys`` against ``step``, one subplot per key; several runs overlay, labelled by
    their directory names. Keys that no run logged are skipped.

    out_png defaults to ``metrics.png`` in the (first) run directory, ``metrics_compare.png`` for several runs.
    Returns the path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dirs = ([Path(run_dir_or_dirs)] if isinstance(run_dir_or_dirs, (str, os.PathLike))
                else [Path(d) for d in run_dir_or_dirs])
    if not run_dirs:
        raise ValueError("plot_run: no run directory given")
    keys = [keys] if isinstance(keys, str) else list(keys)
    if not keys or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"plot_run: keys must be a non-empty list of metric names, got {keys!r}")

    runs = []
    for run_dir in run_dirs:
        path = metrics_path(run_dir)
        if not path.is_file():
            raise ValueError(f"plot_run: no metrics at {path}; the run logged nothing, or this is not a run directory")
        history = read_metrics(run_dir)
        if not history:
            raise ValueError(f"plot_run: {path} holds no metrics records; nothing to plot")
        runs.append((run_dir, history))

    present = [k for k in keys if any(k in r for _, h in runs for r in h)]
    skipped = [k for k in keys if k not in present]
    if skipped:
        logger.info("plot_run: no run logged %s; skipping", skipped)
    if not present:
        available = sorted({k for _, h in runs for r in h for k in r} - {"step", "time"})
        raise ValueError(f"plot_run: none of {keys} in {[str(metrics_path(d)) for d, _ in runs]}; "
                         f"logged metrics are {available}")

    fig = Figure(figsize=(7, 2.6 * len(present)), layout="constrained")
    FigureCanvasAgg(fig)
    axes: List = fig.subplots(len(present), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, present):
        for run_dir, history in runs:
            points = [(r["step"], float(r[key])) for r in history if key in r]
            if points:
                ax.plot([s for s, _ in points], [v for _, v in points], label=run_dir.name or str(run_dir),
                        marker="." if len(points) < 50 else None)
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
        if len(runs) > 1:
            ax.legend(fontsize="small")
    axes[-1].set_xlabel("step")
    if len(runs) == 1:
        axes[0].set_title(run_dirs[0].name or str(run_dirs[0]))

    if out_png is None:
        out_png = run_dirs[0] / ("metrics.png" if len(runs) == 1 else "metrics_compare.png")
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    return out_png
