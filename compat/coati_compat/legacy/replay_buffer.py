"""Legacy in-process replay buffers: ``coati.replay_buffer`` (``ReplayBuffer``, ``NaiveReplayBuffer``) of the
reference version, named ``coati.experience_buffer`` (``ExperienceBuffer``, ``NaiveExperienceBuffer``) in the final
release. The non-Ray PPO trainer sampled from these; the Ray trainers use ``DetachedReplayBuffer`` instead.

``NaiveReplayBuffer`` keeps single-sample ``BufferItem`` s in a list, drops the oldest items beyond ``limit`` (0: no
limit) and samples ``sample_batch_size`` of them at random, without replacement, into one ``Experience``.
``buffer_dataloader`` is what ``Strategy.setup_dataloader`` gives for a buffer: its items in shuffled batches of
``sample_batch_size``, each rank of a data-parallel group reading its own share.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any, Iterator, List

import torch
from torch.utils.data import DataLoader, DistributedSampler

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.experience import BufferItem, Experience, make_experience_batch, split_experience_batch
from coati_relay.parts import accelerator_device


class _ReplayBufferBase(ABC):
    """sample_batch_size: items per ``sample()``; limit: items kept at most (<= 0: unlimited)."""

    def __init__(self, sample_batch_size: int, limit: int = 0) -> None:
        if isinstance(sample_batch_size, bool) or not isinstance(sample_batch_size, int) or sample_batch_size < 1:
            raise ValueError(f"sample_batch_size must be an int >= 1, got {sample_batch_size!r}")
        self.sample_batch_size = sample_batch_size
        self.limit = limit

    @abstractmethod
    def append(self, experience: Experience) -> None:
        """Adds the samples of a batch."""

    @abstractmethod
    def clear(self) -> None:
        """Drops every sample."""

    @abstractmethod
    def sample(self) -> Experience:
        """A batch of ``sample_batch_size`` samples."""

    @abstractmethod
    def __len__(self) -> int:
        """Samples held."""

    @abstractmethod
    def __getitem__(self, idx: int) -> Any:
        """One sample."""

    @abstractmethod
    def collate_fn(self, batch: Any) -> Experience:
        """Merges samples (e.g. from a DataLoader over this buffer) into one batch."""


class _NaiveReplayBufferBase(_ReplayBufferBase):
    """cpu_offload: keep samples on the CPU and move sampled batches to the compute device."""

    def __init__(self, sample_batch_size: int, limit: int = 0, cpu_offload: bool = True) -> None:
        super().__init__(sample_batch_size, limit)
        self.cpu_offload = cpu_offload
        self.target_device = accelerator_device()
        self.items: List[BufferItem] = []

    @torch.no_grad()
    def append(self, experience: Experience) -> None:
        if self.cpu_offload:
            experience.to_device(torch.device("cpu"))
        self.items.extend(split_experience_batch(experience))
        if self.limit > 0 and len(self.items) > self.limit:
            self.items = self.items[len(self.items) - self.limit:]

    def clear(self) -> None:
        self.items.clear()

    @torch.no_grad()
    def sample(self) -> Experience:
        if len(self.items) < self.sample_batch_size:
            raise ValueError(f"cannot sample {self.sample_batch_size} items from a buffer holding {len(self.items)}")
        experience = make_experience_batch(random.sample(self.items, self.sample_batch_size))
        if self.cpu_offload:
            experience.to_device(self.target_device)
        return experience

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> BufferItem:
        return self.items[idx]

    def collate_fn(self, batch: List[BufferItem]) -> Experience:
        return make_experience_batch(batch)


@deprecated_api("coati.replay_buffer.ReplayBuffer")
class ReplayBuffer(_ReplayBufferBase, ABC):
    __doc__ = _ReplayBufferBase.__doc__


@deprecated_api("coati.replay_buffer.NaiveReplayBuffer")
class NaiveReplayBuffer(_NaiveReplayBufferBase, ReplayBuffer):
    __doc__ = _NaiveReplayBufferBase.__doc__


@deprecated_api("coati.experience_buffer.ExperienceBuffer")
class ExperienceBuffer(_ReplayBufferBase, ABC):
    __doc__ = _ReplayBufferBase.__doc__


@deprecated_api("coati.experience_buffer.NaiveExperienceBuffer")
class NaiveExperienceBuffer(_NaiveReplayBufferBase, ExperienceBuffer):
    __doc__ = _NaiveReplayBufferBase.__doc__


class _EpochSampler(DistributedSampler):
    """A ``DistributedSampler`` that moves to the next epoch after each pass, so every pass is a new permutation
    (the same one on every rank)."""

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        self.set_epoch(self.epoch + 1)
        return iter(indices)


def buffer_dataloader(buffer: Any, num_replicas: int = 1, rank: int = 0, seed: int = 0,
                      pin_memory: bool = False) -> DataLoader:
    """A ``DataLoader`` over ``buffer`` (a legacy replay/experience buffer): batches of ``buffer.sample_batch_size``
    items merged by ``buffer.collate_fn``, shuffled with ``seed``, the incomplete last batch dropped. With
    ``num_replicas > 1`` each rank reads every num_replicas-th item of the permutation, so ranks holding the same
    items get different batches, and the same number of them."""
    for name in ("sample_batch_size", "collate_fn", "__len__", "__getitem__"):
        if not hasattr(buffer, name):
            raise TypeError(f"setup_dataloader needs a legacy replay buffer (with {name}), got {type(buffer).__name__}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"need 0 <= rank < num_replicas, got rank={rank}, num_replicas={num_replicas}")
    sampler = _EpochSampler(buffer, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
    return DataLoader(buffer, batch_size=buffer.sample_batch_size, sampler=sampler, drop_last=True,
                      pin_memory=pin_memory, collate_fn=buffer.collate_fn)
