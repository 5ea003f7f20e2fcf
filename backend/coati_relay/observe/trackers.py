"""Experiment trackers: every step's metrics and the run config, sent to TensorBoard and Weights & Biases besides
``metrics.jsonl`` (``report_to`` in the launch keywords).

`MetricsLogger` feeds them from the one place that writes ``metrics.jsonl``: the driver of a disaggregated run, the
one process of a colocated run. No actor holds a tracker. Where the files go:

- ``tensorboard``: event files in ``run_dir/tensorboard`` (``tensorboard --logdir run_dir/tensorboard``);
  one scalar per metric, tagged with its ``metrics.jsonl`` name, at the step's number; the run config as text.
- ``wandb``: a run in the W&B project ``project_name``, its files under ``run_dir/wandb``. Without a W&B login
  (no ``WANDB_API_KEY``, no ``wandb login``) and no ``WANDB_MODE`` set, it runs offline;
  ``wandb sync run_dir/wandb/offline-run-*`` uploads it later.

A tracker that fails (its package is missing, it cannot start, a call raises: not logged in, disk full) stops
nothing: one warning names it and the fix, it is switched off for the rest of the run, and ``metrics.jsonl`` goes on.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Union

log = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"


class Tracker(Protocol):
    """One experiment tracker. ``name``: its ``report_to`` name and package; ``fix``: what to do when it fails for a
    reason other than a missing package."""

    name: str
    fix: str
    where: str  # where its records go, for the run's summary

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Records the metrics of training step ``step`` (NaN for a non-finite value)."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Records the run's configuration (JSON-able values), once."""

    def close(self) -> None:
        """Writes what is buffered and releases the files."""


class TensorBoardTracker:
    """`torch.utils.tensorboard.SummaryWriter` writing to ``log_dir``: a scalar per metric in float64 (the values of
    ``metrics.jsonl``, not rounded to float32), flushed every step."""

    name = "tensorboard"
    fix = "check that the run directory is writable and has free space"

    def __init__(self, log_dir: Union[str, os.PathLike]):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.where = f"{self.log_dir} (tensorboard --logdir {self.log_dir})"

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step, new_style=True, double_precision=True)
        self.writer.flush()  # a failing disk shows at its step, and the curves are current while the run goes on

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = json.dumps(config, indent=2, sort_keys=True)
        self.writer.add_text("run_config", "\n".join("    " + line for line in text.splitlines()))  # markdown code
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def wandb_logged_in() -> bool:
    """Whether W&B has credentials here (``WANDB_API_KEY``, a ``wandb login``), without asking for them or asking
    the server."""
    import wandb

    return bool(wandb.login(prompt=False, verify=False))


class WandbTracker:
    """A `wandb` run in project ``project`` named after the run directory, its files under ``run_dir/wandb``; offline
    when there is no login and ``WANDB_MODE`` is not set. The driver's console output is not captured."""

    name = "wandb"
    fix = ("run `wandb login`, or set WANDB_MODE=offline and upload later with `wandb sync "
           "RUN_DIR/wandb/offline-run-*`; check that the run directory is writable and has free space")

    def __init__(self, run_dir: Union[str, os.PathLike], project: str):
        import wandb

        mode = None
        if not os.environ.get("WANDB_MODE") and not wandb_logged_in():
            mode = "offline"
            log.info("wandb: no W&B login, so the run is written offline under %s/wandb; upload it with "
                     "`wandb sync %s/wandb/offline-run-*`", run_dir, run_dir)
        self.run = wandb.init(project=project, name=Path(run_dir).name, dir=str(run_dir), mode=mode,
                              reinit="create_new", settings=wandb.Settings(console="off", silent=True))
        self.where = (getattr(self.run, "url", None) if mode is None else None) or \
            f"{run_dir}/wandb (offline: wandb sync {run_dir}/wandb/offline-run-*)"

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The run's trackers behind one front that never raises: a tracker whose call fails is warned about once
    (naming it and the fix) and switched off; the others, and the caller, go on."""

    def __init__(self, trackers: Sequence[Tracker] = ()):
        self.active: List[Tracker] = list(trackers)
        self.where: Dict[str, str] = {t.name: t.where for t in trackers}  # every one started, failed later or not

    def __bool__(self) -> bool:
        return bool(self.active)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for tracker in list(self.active):
            self._call(tracker, f"logging step {step}", lambda t: t.log(step, metrics))

    def log_config(self, config: Mapping[str, Any]) -> None:
        for tracker in list(self.active):
            self._call(tracker, "logging the run config", lambda t: t.log_config(config))

    def close(self) -> None:
        for tracker in list(self.active):
            self._call(tracker, "closing", lambda t: t.close())
        self.active = []

    def _call(self, tracker: Tracker, what: str, call: Callable[[Tracker], None]) -> None:
        try:
            call(tracker)
        except Exception as exc:
            self.active.remove(tracker)
            warn_failed(tracker.name, what, exc, tracker.fix)
            try:
                tracker.close()
            except Exception:  # it failed already; its files are as complete as they will get
                pass


def warn_failed(name: str, what: str, exc: BaseException, fix: str) -> None:
    """The one warning of a failed tracker; a failed import's fix is installing the package."""
    if isinstance(exc, ImportError):
        fix = f"pip install {name} (or leave {name!r} out of report_to)"
    log.warning("report_to %r: the %s tracker failed while %s (%s: %s) and is switched off for the rest of this "
                "run; the run goes on and metrics.jsonl keeps every step. Fix: %s", name, name, what,
                type(exc).__name__, exc, fix)




def open_trackers(report_to: Sequence[str], run_dir: Union[str, os.PathLike], project: str,
                  config: Optional[Mapping[str, Any]] = None) -> Trackers:
    """Starts the trackers ``report_to`` names (checked by `coati_relay.config.report_to.check_report_to`) for the run
    in ``run_dir`` and logs ``config`` to them once. One that cannot start is warned about and left out."""
    started: List[Tracker] = []
    for name in report_to:
        try:
            started.append(TensorBoardTracker(Path(run_dir) / TENSORBOARD_DIR) if name == "tensorboard"
                           else WandbTracker(run_dir, project))
        except Exception as exc:  # ImportError included: the package is not installed
            warn_failed(name, "starting", exc, (TensorBoardTracker if name == "tensorboard" else WandbTracker).fix)
    trackers = Trackers(started)
    if config is not None:
        trackers.log_config(config)
    return trackers


def plain(value: Any) -> Any:
    """``value`` as JSON-able data: dataclasses and mappings as dicts, sequences as lists, paths and other objects as
    text, non-finite floats as text (``"nan"``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return getattr(value, "__qualname__", None) or str(value)


def run_config_dict(cfg: Any) -> Dict[str, Any]:
    """The run config (a `RunConfig`) as the trackers record it: its sections as nested dicts, without the user code
    the actors unpickle."""
    config = plain(cfg)
    config.pop("user_code", None)
    if isinstance(cfg.data.dataset, list):  # prompts given inline: their number, not their text
        config["data"]["dataset"] = f"{len(cfg.data.dataset)} prompts given inline"
    return config


def open_run_trackers(cfg: Any) -> Trackers:
    """The trackers of a run (a `RunConfig`): ``cfg.report_to``, writing under its run directory, W&B project
    ``cfg.project_name``; the run config logged once."""
    if not cfg.report_to:
        return Trackers()
    return open_trackers(cfg.report_to, cfg.checkpointing.run_dir, cfg.project_name, run_config_dict(cfg))
