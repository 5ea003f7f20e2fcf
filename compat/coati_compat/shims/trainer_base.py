"""Legacy ``coati.ray.detached_trainer_base.DetachedTrainer``: the trainer role, a plain abstract class.

Users subclass it, implement ``training_step`` and ``_update_remote_makers``, and decorate the subclass with
``@ray.remote(concurrency_groups={"buffer_length": 1, "buffer_append": 1, "buffer_sample": 1, "model_io": 1,
"compute": 1})`` as the legacy docs show; the shim's ``DetachedPPOTrainer`` is built the same way.

``fit(total_steps, update_steps, train_epochs)`` keeps the legacy order exactly (legacy_spec §A.3): per episode one
fresh epoch of ``update_steps`` sampled batches, ``train_epochs - 1`` replays of the same batches in shuffled order,
then one weight push.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional

import ray
import torch
from torch.utils.data import DataLoader

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.callbacks import TrainerCallback
from coati_compat.legacy.experience import BufferItem, Experience
from coati_compat.observers import trainer_observers
from coati_compat.shims.remote import LegacyActorBase, enable_debug_logging, get_named_actor
from coati_compat.shims.replay_buffer import DetachedReplayBuffer
from coati_relay.parts import accelerator_device

logger = logging.getLogger(__name__)

TRAINER_CONCURRENCY_GROUPS = {"buffer_length": 1, "buffer_append": 1, "buffer_sample": 1, "model_io": 1,
                              "compute": 1}


def check_count(who: str, name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{who}: {name} must be an int >= {low}, got {value!r}")


@deprecated_api("coati.ray.detached_trainer_base.DetachedTrainer")
class DetachedTrainer(LegacyActorBase, ABC):
    """Base of the legacy trainers: a replay buffer fed by makers, the legacy ``fit`` loop and its callbacks.

    experience_maker_holder_name_list: names (in ``$RAY_NAMESPACE``) of the makers this trainer pushes weights to.
    train_batch_size: items per sampled batch; buffer_limit: batches the buffer holds at most (0: unbounded).
    """

    _legacy_name = "coati.ray.detached_trainer_base.DetachedTrainer"

    def __init__(self, experience_maker_holder_name_list: List[str], train_batch_size: int = 8,
                 buffer_limit: int = 0, dataloader_pin_memory: bool = True,
                 callbacks: Optional[List[TrainerCallback]] = None, debug: bool = False) -> None:
        super().__init__()
        if isinstance(experience_maker_holder_name_list, str) or not all(
                isinstance(n, str) for n in experience_maker_holder_name_list):
            raise TypeError("experience_maker_holder_name_list must be a list of actor names (str), got "
                            f"{experience_maker_holder_name_list!r}")
        check_count(type(self).__name__, "train_batch_size", train_batch_size, 1)
        self.detached_replay_buffer = DetachedReplayBuffer(train_batch_size, limit=buffer_limit)
        self.dataloader_pin_memory = dataloader_pin_memory
        self.callbacks: List[TrainerCallback] = list(callbacks or []) + trainer_observers()  # e.g. compare's recorder
        self.target_holder_name_list = list(experience_maker_holder_name_list)
        self.target_holder_list: List[Any] = []
        self._is_target_holder_initialized = False
        self._debug = debug
        if debug:
            enable_debug_logging(logger)

    def update_target_holder_list(self) -> None:
        """Looks the makers up by name, once (on the first push)."""
        if self._is_target_holder_initialized:
            return
        self.target_holder_list = [get_named_actor(name, "experience maker") for name in self.target_holder_name_list]
        self._is_target_holder_initialized = True

    @abstractmethod
    def _update_remote_makers(self, fully_update: bool = False, **kwargs: Any) -> None:
        """Pushes the current weights to the makers of ``target_holder_list``."""

    def sync_models_to_remote_makers(self, **kwargs: Any) -> None:
        """The full initial push (makers built with ``sync_models_from_trainers=True`` wait for it)."""
        self._update_remote_makers(fully_update=True, **kwargs)

    @abstractmethod
    def training_step(self, experience: Experience) -> Dict[str, Any]:
        """One optimisation step on one batch; returns the metrics passed to ``on_batch_end``."""

    def _learn(self, update_steps: int, train_epochs: int) -> None:
        data: List[Experience] = []
        device = accelerator_device()
        self._on_epoch_start(0)
        for _ in range(update_steps):
            experience = self._buffer_sample()
            self._train_on(experience, device)
            data.append(experience)
        self._on_epoch_end(0)
        for epoch in range(1, train_epochs):
            loader = DataLoader(data, batch_size=1, shuffle=True, collate_fn=lambda x: x[0],
                                pin_memory=self.dataloader_pin_memory and torch.cuda.is_available())
            self._on_epoch_start(epoch)
            for experience in loader:
                self._train_on(experience, device)
            self._on_epoch_end(epoch)

    def _train_on(self, experience: Experience, device: torch.device) -> None:
        experience.to_device(device)
        self._on_batch_start()
        logger.debug("[trainer] training step")
        metrics = self.training_step(experience)
        logger.debug("[trainer] step over")
        self._on_batch_end(metrics, experience)
        experience.to_device("cpu")

    def fit(self, total_steps: int, update_steps: int, train_epochs: int = 1) -> None:
        """``total_steps // update_steps`` episodes of ``update_steps`` sampled batches trained ``train_epochs``
        times, each followed by one weight push."""
        check_count("fit", "total_steps", total_steps, 0)
        check_count("fit", "update_steps", update_steps, 1)
        check_count("fit", "train_epochs", train_epochs, 1)
        buffer = self.detached_replay_buffer
        buffer.set_throttle(True)
        try:
            self._on_fit_start()
            for episode in range(total_steps // update_steps):
                self._on_episode_start(episode)
                self._learn(update_steps, train_epochs)
                self._on_update_start()
                self._update_remote_makers()
                self._on_update_end()
                self._on_episode_end(episode)
            self._on_fit_end()
        finally:
            buffer.set_throttle(False)
            buffer.report_leftover()

    # -- remote buffer API (called by the makers) ------------------------------------------------------------
    @ray.method(concurrency_group="buffer_length")
    def buffer_get_length(self) -> int:
        logger.debug("[trainer] telling length")
        return self.detached_replay_buffer.get_length()

    @ray.method(concurrency_group="buffer_append")
    def buffer_append(self, experience: Experience) -> None:
        logger.debug("[trainer] receiving exp.")
        self.detached_replay_buffer.append(experience)

    @ray.method(concurrency_group="buffer_append")
    def buffer_extend(self, items: List[BufferItem]) -> None:
        logger.debug("[trainer] receiving exp.")
        self.detached_replay_buffer.extend(items)

    @ray.method(concurrency_group="buffer_sample")
    def _buffer_sample(self) -> Experience:
        return self.detached_replay_buffer.sample()

    @ray.method(concurrency_group="buffer_length")
    def buffer_register_producer(self, name: str, handle: Any = None) -> None:
        """Non-legacy: a maker announces itself, so that a waiting ``fit`` notices when every maker is gone."""
        self.detached_replay_buffer.register_producer(name, handle)

    @ray.method(concurrency_group="buffer_length")
    def buffer_producer_finished(self, name: str) -> None:
        """Non-legacy: a maker's working loop has ended."""
        self.detached_replay_buffer.producer_finished(name)

    @ray.method(concurrency_group="buffer_length")
    def buffer_counters(self) -> Dict[str, Any]:
        """Non-legacy: the buffer's counters (batches produced/consumed, pending and dropped items)."""
        return self.detached_replay_buffer.counters()

    # -- callbacks -----------------------------------------------------------------------------------------------
    def _on_fit_start(self) -> None:
        for cb in self.callbacks:
            cb.on_fit_start()

    def _on_fit_end(self) -> None:
        for cb in self.callbacks:
            cb.on_fit_end()

    def _on_episode_start(self, episode: int) -> None:
        for cb in self.callbacks:
            cb.on_episode_start(episode)

    def _on_episode_end(self, episode: int) -> None:
        for cb in self.callbacks:
            cb.on_episode_end(episode)

    def _on_epoch_start(self, epoch: int) -> None:
        for cb in self.callbacks:
            cb.on_epoch_start(epoch)

    def _on_epoch_end(self, epoch: int) -> None:
        for cb in self.callbacks:
            cb.on_epoch_end(epoch)

    def _on_batch_start(self) -> None:
        for cb in self.callbacks:
            cb.on_batch_start()

    def _on_batch_end(self, metrics: Dict[str, Any], experience: Experience) -> None:
        for cb in self.callbacks:
            cb.on_batch_end(metrics, experience)

    def _on_update_start(self) -> None:
        for cb in self.callbacks:
            cb.on_update_start()

    def _on_update_end(self) -> None:
        for cb in self.callbacks:
            cb.on_update_end()
