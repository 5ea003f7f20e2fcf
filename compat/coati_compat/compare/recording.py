"""Records of a legacy run for ``coati-relay compare``, written by callbacks the shims' trainers and makers take as
observers (`coati_compat.observers`; `recording_switch.recording_env` names this module there).

Off unless ``$COATI_RELAY_COMPARE_EVENTS`` names a directory (the compare run sets it; Ray workers inherit it). Then
every process appends JSON lines to ``<dir>/events-<pid>.jsonl``, one object per event:

- ``experience`` (a maker's batch): ``t0``, ``t1``, ``samples``, the reward model's score (``reward_sum``,
  ``reward_sq_sum``) and the maker's KL estimate per sample (``kl_sum``: k3 of the actor against the initial model,
  masked mean over each sample's actions, as the maker shapes its reward);
- ``train`` (a trainer's batch): ``episode``, ``epoch``, ``t0``, ``t1``, ``samples`` and the numbers the training
  step returned (``actor_loss``, ``critic_loss``, ...);
- ``push`` (a trainer's weight push after an episode): ``episode``, ``t0``, ``t1``.

Every event also has ``event``, ``pid`` and ``role`` (the Ray actor class of the process, ``driver`` outside Ray).
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Dict, List, Optional

import torch

from coati_compat.compare.recording_switch import events_dir
from coati_compat.legacy.callbacks import MakerCallback, TrainerCallback
from coati_compat.legacy.ppo_shaping import legacy_sequence_kl

logger = logging.getLogger(__name__)

def process_role() -> str:
    """The Ray actor class this process runs (``ray::PolicyWorker.learn`` -> ``PolicyWorker``), else ``driver``."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            title = f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return "driver"
    if not title.startswith("ray::"):
        return "driver"
    return title[len("ray::"):].split(".")[0].split(" ")[0].rpartition(":")[2] or "driver"


class EventWriter:
    """Appends events to this process's file in ``directory``."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, f"events-{os.getpid()}.jsonl")

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, "pid": os.getpid(), "role": process_role(), **fields}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def sample_stats(prefix: str, values: torch.Tensor) -> Dict[str, float]:
    """``{prefix_sum, prefix_sq_sum}`` of a [B] tensor (sums, so that batches of several processes combine)."""
    values = values.detach().float().reshape(-1).cpu()
    return {f"{prefix}_sum": values.sum().item(), f"{prefix}_sq_sum": (values * values).sum().item()}


def per_sample_kl(log_probs: torch.Tensor, base_log_probs: torch.Tensor,
                  action_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The legacy maker's KL estimate per sample: k3, masked mean over the actions. [B,A] -> [B]."""
    return legacy_sequence_kl(log_probs.float(), base_log_probs.float(),
                              None if action_mask is None else action_mask.float())


class TrainerRecorder(TrainerCallback):
    """Writes a ``train`` event per batch and a ``push`` event per weight push of a legacy trainer."""

    def __init__(self, writer: EventWriter) -> None:
        self.writer = writer
        self.episode = self.epoch = 0
        self._t0 = self._u0 = 0.0

    def on_episode_start(self, episode: int) -> None:
        self.episode = episode

    def on_epoch_start(self, epoch: int) -> None:
        self.epoch = epoch

    def on_batch_start(self) -> None:
        self._t0 = time.time()

    def on_batch_end(self, metrics: Dict[str, Any], experience: Any) -> None:
        numbers = {k: float(v) for k, v in (metrics or {}).items()
                   if isinstance(v, (int, float, torch.Tensor)) and not isinstance(v, bool)
                   and (not isinstance(v, torch.Tensor) or v.numel() == 1)}
        self.writer.write("train", episode=self.episode, epoch=self.epoch, t0=self._t0, t1=time.time(),
                          samples=int(experience.sequences.size(0)), **numbers)

    def on_update_start(self) -> None:
        self._u0 = time.time()

    def on_update_end(self) -> None:
        self.writer.write("push", episode=self.episode, t0=self._u0, t1=time.time())


class MakerRecorder(MakerCallback):
    """Writes an ``experience`` event per batch of a legacy maker: the reward model's score and the KL estimate,
    read by forward hooks on the maker's reward model and initial model (they run once per batch)."""

    def __init__(self, writer: EventWriter, experience_maker: Any) -> None:
        self.writer = writer
        self._outputs: Dict[str, Any] = {}
        self._t0 = 0.0
        for name in ("reward_model", "initial_model"):
            module = getattr(experience_maker, name, None)
            if isinstance(module, torch.nn.Module):
                module.register_forward_hook(self._keeper(name))

    def _keeper(self, name: str):
        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            self._outputs[name] = output

        return keep

    def on_make_experience_start(self) -> None:
        self._t0 = time.time()
        self._outputs.clear()

    def on_make_experience_end(self, experience: Any) -> None:
        fields: Dict[str, float] = {}
        score, base = self._outputs.get("reward_model"), self._outputs.get("initial_model")
        batch = experience.sequences.size(0)
        if isinstance(score, torch.Tensor) and score.numel() == batch:
            fields.update(sample_stats("reward", score))
        logp = experience.action_log_probs
        if isinstance(base, torch.Tensor) and base.shape == logp.shape:
            fields.update(sample_stats("kl", per_sample_kl(logp, base, experience.action_mask)))
        self.writer.write("experience", t0=self._t0, t1=time.time(), samples=int(batch), **fields)


def trainer_callbacks() -> List[TrainerCallback]:
    """``[TrainerRecorder]`` while recording is on, else ``[]`` (what a legacy trainer adds to its callbacks)."""
    directory = events_dir()
    return [TrainerRecorder(EventWriter(directory))] if directory else []


def maker_callbacks(experience_maker: Any) -> List[MakerCallback]:
    """``[MakerRecorder]`` while recording is on, else ``[]`` (what a legacy maker adds to its callbacks)."""
    directory = events_dir()
    return [MakerRecorder(EventWriter(directory), experience_maker)] if directory else []
