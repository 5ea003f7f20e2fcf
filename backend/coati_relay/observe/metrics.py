"""Run observability on the driver: a metrics JSONL file, a progress bar, and the end-of-run summary.

Every run directory holds ``metrics.jsonl``: one JSON object per training step, ``{"step": int, "time": float (unix
seconds), <metric>: float | null, ...}``. Non-finite values are written as ``null`` (JSON has no NaN) and read back
as NaN.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, TextIO, Union

from coati_relay.config.run_dir import METRICS_FILE

logger = logging.getLogger(__name__)

_RESERVED = ("step", "time")


def metrics_path(run_dir_or_file: Union[str, os.PathLike]) -> Path:
    """``run_dir/metrics.jsonl``, or the path itself when it already names a ``.jsonl`` file."""
    path = Path(run_dir_or_file)
    return path if path.suffix == ".jsonl" else path / METRICS_FILE


def _to_number(key: str, value: Any) -> float:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"metric {key!r} must be a number (int, float, numpy or 0-d torch scalar), "
                        f"got {type(value).__name__}: {value!r:.60}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"metric {key!r} must be a scalar; float() failed on {type(value).__name__}: {e}") from None


def read_metrics(run_dir: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl`` in file order, nulls read back as NaN.

    A cut-off last line (a run killed while writing) is skipped with a warning; any other bad line raises.
    """
    path = metrics_path(run_dir)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}; pass a run directory that holds {METRICS_FILE}")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines):
                logger.warning("%s:%d: skipping a cut-off last line (%s)", path, lineno, e.msg)
                continue
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}); fix or delete that line") from None
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{path}:{lineno}: expected an object with a 'step' field, got {line:.80}")
        records.append({k: (math.nan if v is None else v) for k, v in record.items()})
    return records


def _step_of(line: str) -> float:
    """The step of one metrics line; a cut-off line (never a complete step) counts as after every step."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf


class MetricsLogger:
    """Appends one JSON line per step to ``run_dir/metrics.jsonl``.

    An existing file is continued (a resumed run); `history` starts with its records. ``drop_after``: the step a
    resumed run restarts from; records of later steps describe work its checkpoint does not hold (the run was
    killed after them), so they are removed from the file and each step is logged once. ``trackers``
    (`coati_relay.observe.trackers.Trackers`): each step's metrics go to them too, after the file; `close` closes them.
    The records live in the file only: a run of any length holds none of them in memory here.
    """

    def __init__(self, run_dir: Union[str, os.PathLike], drop_after: Optional[int] = None,
                 trackers: Optional[Any] = None):
        self.run_dir = Path(run_dir)
        self.trackers = trackers
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        if drop_after is not None and self.path.is_file() and any(r["step"] > drop_after for r in self.history):
            lines = [line for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
            kept = [line for line in lines if _step_of(line) <= drop_after]
            logger.warning("%s: dropping %d record(s) after step %d, which the resumed checkpoint does not hold",
                           self.path, len(lines) - len(kept), drop_after)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(tmp, self.path)

    @property
    def history(self) -> List[Dict[str, Any]]:
        """Every record of this run so far, as `read_metrics` returns them (read from the file at each call)."""
        return read_metrics(self.run_dir) if self.path.is_file() else []

    def log(self, step: int, metrics: Mapping[str, Any]) -> Dict[str, Any]:
        """Writes ``{"step", "time", **metrics}`` as one line and returns the record (non-finite values as NaN)."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"MetricsLogger.log: step must be an int, got {type(step).__name__}")
        if not isinstance(metrics, Mapping):
            raise TypeError(f"MetricsLogger.log: metrics must be a dict of name -> number, "
                            f"got {type(metrics).__name__}")
        for key in metrics:
            if not isinstance(key, str) or key in _RESERVED:
                raise ValueError(f"MetricsLogger.log: bad metric name {key!r}; names are strings other than "
                                 f"{_RESERVED} (the logger writes those)")
        values = {k: _to_number(k, v) for k, v in metrics.items()}
        record = {"step": step, "time": time.time(), **values}
        line = json.dumps({k: (v if not isinstance(v, float) or math.isfinite(v) else None)
                           for k, v in record.items()}, allow_nan=False)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        record = {k: (v if not isinstance(v, float) or math.isfinite(v) else math.nan) for k, v in record.items()}
        if self.trackers:
            self.trackers.log(step, {k: v for k, v in record.items() if k not in _RESERVED})
        return record

    def close(self) -> None:
        """Closes the trackers (the file is closed after every line)."""
        if self.trackers:
            self.trackers.close()


def _fmt_number(value: float) -> str:
    """Three decimals; three significant digits for tiny non-zero values (so 1e-7 does not print as 0.000)."""
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value) and value != 0 and abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.3f}"


_PROGRESS_FIELDS = (("reward", "reward"), ("loss", "loss"), ("kl", "kl"), ("frac_reward_zero_std", "zero_std"),
                    ("samples_per_s", "samples/s"))


def _fmt_eta(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar:
    """A driver-side progress display over training steps: the step, reward, loss, KL (where the run has it), the
    fraction of groups whose rewards are all equal (``zero_std``), samples/s and the time left.

    On a terminal it is a tqdm bar with those fields. Otherwise (CI logs, captured output, a file) it writes one line
    per step to ``file`` (stderr by default), whatever the logging set-up, e.g.
    ``GRPO toy: step 3/10 reward=0.500 loss=0.012 kl=0.001 samples/s=41.3 eta=0:00:21``. ``force_bar`` asks
    for the bar anyway; ``enabled=False`` silences both.
    """

    def __init__(self, total_steps: int, desc: str = "train", enabled: bool = True, force_bar: bool = False,
                 file: Optional[TextIO] = None, first_step: int = 0):
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"ProgressBar: total_steps must be a positive int, got {total_steps!r}")
        self.total_steps, self.desc = total_steps, desc
        self.file = sys.stderr if file is None else file
        is_tty = bool(getattr(self.file, "isatty", lambda: False)())
        self.mode = "off" if not enabled else ("bar" if is_tty or force_bar else "line")
        self._start, self._first = time.monotonic(), first_step  # for the ETA: steps done here, time taken
        self._bar = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=first_step, desc=desc, file=self.file, unit="step",
                             dynamic_ncols=True)

    @classmethod
    def for_run(cls, cfg: Any, first_step: int = 0) -> "ProgressBar":
        """The progress display of a run (`coati_relay.config.schema.RunConfig`) resumed at ``first_step``."""
        return cls(cfg.total_rounds, desc=f"{cfg.core_algo} {cfg.project_name}", enabled=cfg.progress,
                   first_step=first_step)

    def fields(self, done: int, metrics: Optional[Mapping[str, Any]]) -> Dict[str, str]:
        """The shown fields after ``done`` steps: the metrics present and finite, and the ETA (line mode)."""
        shown = {}
        for key, label in _PROGRESS_FIELDS:
            value = None if metrics is None else metrics.get(key)
            if value is not None and math.isfinite(float(value)):
                shown[label] = f"{float(value):.1f}" if key == "samples_per_s" else _fmt_number(float(value))
        if self.mode == "line" and done > self._first:
            rate = (time.monotonic() - self._start) / (done - self._first)
            shown["eta"] = _fmt_eta(rate * (self.total_steps - done))
        return shown

    def update(self, step: int, metrics: Optional[Mapping[str, Any]] = None) -> None:
        """Shows that step ``step`` (counting from 0) has finished: ``step + 1`` of ``total_steps`` are done."""
        if self.mode == "off":
            return
        done = min(int(step) + 1, self.total_steps)
        shown = self.fields(done, metrics)
        if self.mode == "bar":
            self._bar.n = done
            self._bar.set_postfix(shown, refresh=False)
            self._bar.refresh()
        else:
            print(f"{self.desc}: step {done}/{self.total_steps} " + " ".join(f"{k}={v}" for k, v in shown.items()),
                  file=self.file, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def round_numbers(record: Mapping[str, Any]) -> Dict[str, Any]:
    """The numbers of a consumer's round record that go to ``metrics.jsonl`` and the progress display: clock times
    (``*_at``), ``step``, ``time`` and non-numbers stay in the history only."""
    return {k: v for k, v in record.items()
            if k not in _RESERVED and not k.endswith("_at") and isinstance(v, (int, float))}


def summary_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A plain-text table: a header, a rule, one line per row. Numeric columns are right-aligned with three
    decimals; a missing or None cell prints as ``-``."""
    if isinstance(columns, str) or not columns or not all(isinstance(c, str) for c in columns):
        raise ValueError(f"summary_table: columns must be a non-empty list of names, got {columns!r}")
    if any(not isinstance(r, Mapping) for r in rows):
        raise TypeError("summary_table: rows must be dicts of column -> value")

    def is_number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    cells = [[("-" if r.get(c) is None else _fmt_number(r[c]) if is_number(r[c]) else str(r[c])) for c in columns]
             for r in rows]
    numeric = [all(is_number(r[c]) for r in rows if r.get(c) is not None) for c in columns]
    widths = [max([len(c)] + [len(line[j]) for line in cells]) for j, c in enumerate(columns)]

    def render(line: Sequence[str]) -> str:
        return "  ".join(s.rjust(w) if num else s.ljust(w) for s, w, num in zip(line, widths, numeric)).rstrip()

    return "\n".join([render(columns), render(["-" * w for w in widths])] + [render(line) for line in cells])


def _mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def run_summary(history: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Headline numbers of a run from its metrics records.

    steps: number of records; samples_per_s: mean of ``samples_per_s``; reward_start / reward_end: mean ``reward`` of
    the first / last three records that have one; weight_sync_s_per_step: mean of ``weight_sync_s``; wall_s: time
    between the first and the last record. A number whose inputs are absent is None. NaN values are ignored.
    """
    if not history:
        raise ValueError("run_summary: the metrics history is empty; log at least one step first")

    def series(key: str) -> List[float]:
        out = []
        for r in history:
            v = r.get(key)
            if v is not None and math.isfinite(float(v)):
                out.append(float(v))
        return out

    rewards, times = series("reward"), series("time")
    return {
        "steps": len(history),
        "samples_per_s": _mean(series("samples_per_s")),
        "reward_start": _mean(rewards[:3]),
        "reward_end": _mean(rewards[-3:]),
        "weight_sync_s_per_step": _mean(series("weight_sync_s")),
        "wall_s": times[-1] - times[0] if times else None,
    }


class ReportLog:
    """Consumer metrics records in order of posting, for one reader (the driver) that polls for the ones it has not
    seen. A record is held until the reader has it: ``since(index)`` says the reader holds the first ``index``
    records, which are forgotten, so a run of any length holds only the records posted since the last poll."""

    def __init__(self) -> None:
        self._records: List[Dict[str, Any]] = []
        self._first = 0  # the index (in posting order) of ``_records[0]``

    def post(self, record: Dict[str, Any]) -> None:
        self._records.append(record)

    def since(self, index: int = 0) -> List[Dict[str, Any]]:
        """Records ``index`` onwards (``index`` = how many the caller has read); forgets the ones before it.
        Raises ValueError when ``index`` asks for forgotten records or runs past those posted."""
        if not self._first <= index <= self._first + len(self._records):
            raise ValueError(f"ReportLog.since({index}): the reader read (and this log forgot) {self._first} "
                             f"records and {len(self._records)} more are held; pass how many the reader holds")
        del self._records[:index - self._first]
        self._first = index
        return list(self._records)

    def __len__(self) -> int:
        """Records held (posted and not yet read)."""
        return len(self._records)
