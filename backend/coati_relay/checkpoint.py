"""Run checkpoints: every `TrainingBackend` of a consumer plus a JSON state, written atomically.

Layout::

    run_dir/checkpoints/step-000010/<backend name>/{model.pt, optimizer.pt, lr_scheduler.pt}
    run_dir/checkpoints/step-000010/state.json      {"step": 10, ...anything JSON: round, version}
    run_dir/checkpoints/latest                      "step-000010"

A checkpoint is written into a hidden temporary directory and renamed into place once complete, so a crash leaves
either the previous checkpoint or the new one, never half of one. Every rank of the data-parallel group calls
`save_checkpoint` and `load_checkpoint`; rank 0 writes.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Union

from coati_relay.training.distributed import barrier

if TYPE_CHECKING:
    from coati_relay.training.booster_backend import TrainingBackend

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR, STATE_FILE, LATEST_FILE = "checkpoints", "state.json", "latest"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def save_due(rounds_done: int, rounds_per_episode: int, save_interval: int) -> bool:
    """Whether a checkpoint follows the ``rounds_done``-th round (1-based, counted over the whole run): ColossalChat's
    cadence (``BaseConsumer.loop``): after every ``save_interval``-th round of an episode, counted from the episode's
    start, and after each episode's last round."""
    step = (rounds_done - 1) % rounds_per_episode + 1  # the round's place in its episode, 1-based
    return step % save_interval == 0 or step == rounds_per_episode


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _check_backends(backends: Dict[str, "TrainingBackend"]) -> None:
    if not isinstance(backends, dict):
        raise TypeError(f"backends must be a dict name -> TrainingBackend, got {type(backends).__name__}")
    for name, backend in backends.items():
        if not isinstance(name, str) or not _NAME.match(name) or name == STATE_FILE:
            raise ValueError(f"backend name {name!r} must be a plain directory name (letters, digits, _ . -)")
        if not (hasattr(backend, "save") and hasattr(backend, "load")):
            raise TypeError(f"backends[{name!r}] must be a TrainingBackend, got {type(backend).__name__}")


def list_checkpoints(run_dir: Union[str, os.PathLike]) -> List[Path]:
    """Complete checkpoints of a run (those with a state file), oldest step first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def _write_text_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(run_dir: Union[str, os.PathLike], step: int, backends: Dict[str, "TrainingBackend"],
                    state: Dict[str, Any]) -> Path:
    """Writes ``run_dir/checkpoints/step-{step:06d}`` (replacing one of the same step) and points ``latest`` at it.

    state: JSON-serialisable dict; ``step`` is added to it. Returns the checkpoint directory.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint: step must be an int >= 0, got {step!r}")
    _check_backends(backends)
    if not isinstance(state, dict):
        raise TypeError(f"save_checkpoint: state must be a dict, got {type(state).__name__}")
    if "step" in state and state["step"] != step:
        raise ValueError(f"save_checkpoint: state['step']={state['step']!r} disagrees with step={step}")
    try:
        state_text = json.dumps({**state, "step": step}, indent=1, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"save_checkpoint: state must hold only JSON values (numbers, strings, lists, dicts): "
                        f"{e}") from e

    root = Path(run_dir) / CHECKPOINTS_DIR
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-{final.name}"
    is_writer = _rank() == 0
    if is_writer:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    for name, backend in backends.items():
        backend.save(tmp / name)
    barrier()
    if is_writer:
        (tmp / STATE_FILE).write_text(state_text)
        if final.exists():
            old = root / f".old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        _write_text_atomically(root / LATEST_FILE, final.name)
        logger.info("checkpoint written: %s (%s)", final, ", ".join(backends) or "state only")
    barrier()
    return final


def _resolve(path_or_run_dir: Union[str, os.PathLike]) -> Path:
    path = Path(path_or_run_dir)
    if (path / STATE_FILE).is_file():
        return path
    root = path / CHECKPOINTS_DIR
    if not root.is_dir():
        raise FileNotFoundError(f"no checkpoint at {path}: expected a step directory holding {STATE_FILE} "
                                f"or a run directory holding {CHECKPOINTS_DIR}/")
    latest = root / LATEST_FILE
    if latest.is_file():
        step_dir = root / latest.read_text().strip()
        if (step_dir / STATE_FILE).is_file():
            return step_dir
        logger.warning("%s names %s, which is incomplete; using the newest complete checkpoint", latest, step_dir)
    found = list_checkpoints(path)
    if not found:
        raise FileNotFoundError(f"run directory {path} holds no complete checkpoint")
    return found[-1]


def resolve_checkpoint(path_or_run_dir: Union[str, os.PathLike]) -> Path:
    """The step directory of a checkpoint: ``path_or_run_dir`` itself, or the latest complete checkpoint of a run
    directory. FileNotFoundError, naming what was expected, when it is neither."""
    return _resolve(path_or_run_dir)


def load_checkpoint(path_or_run_dir: Union[str, os.PathLike], backends: Dict[str, "TrainingBackend"]) -> Dict[str, Any]:
    """Restores every backend from a step directory, or from the latest checkpoint of a run directory, and
    returns the saved state dict (with ``step``)."""
    _check_backends(backends)
    step_dir = _resolve(path_or_run_dir)
    try:
        state = json.loads((step_dir / STATE_FILE).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"checkpoint {step_dir} is corrupt: {STATE_FILE} is not JSON ({e})") from e
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise ValueError(f"checkpoint {step_dir} is corrupt: {STATE_FILE} has no integer 'step'")
    missing = [name for name in backends if not (step_dir / name).is_dir()]
    if missing:
        present = sorted(p.name for p in step_dir.iterdir() if p.is_dir())
        raise ValueError(f"checkpoint {step_dir} has no {missing}; it holds {present}")
    for name, backend in backends.items():
        try:
            backend.load(step_dir / name)
        except FileNotFoundError:
            raise
        except Exception as e:  # a truncated or foreign file: say which one
            raise ValueError(f"checkpoint {step_dir / name} could not be loaded ({type(e).__name__}: {e})") from e
    logger.info("checkpoint loaded: %s", step_dir)
    return state
