"""Records of a legacy script that runs its own Ray actors (a four-role script) and calls the legacy functions.

`install` runs in every Ray worker of the compare run (``legacy_launch`` adds it to the job's
``worker_process_setup_hook``) and wraps, in that process, the legacy surface such scripts call:

- ``coati.models.utils.compute_reward(r, kl_coef, log_probs, log_probs_base, action_mask)``: an ``experience``
  event with the reward model's score ``r`` and the KL estimate per sample (as in `recording`);
- ``coati.models.loss.PolicyLoss`` and ``ValueLoss``: a ``loss`` event (``which``: ``actor`` or ``critic``) per call.

The wrappers return what the legacy functions return. Off (`install` does nothing) unless recording is on.
"""
from __future__ import annotations

import functools
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from coati_compat.compare.recording_switch import events_dir
from coati_compat.imports.after_import import patch_after_import

if TYPE_CHECKING:
    import torch

    from coati_compat.compare.recording import EventWriter

logger = logging.getLogger(__name__)

_INSTALLED = "_coati_compare_recorded"
RL_FUNCTIONS, LOSSES = "coati_compat.legacy.rl_functions", "coati_compat.legacy.losses"


def _recorded_compute_reward(original: Callable[..., torch.Tensor], writer: EventWriter) -> Callable[..., Any]:
    from coati_compat.compare.recording import per_sample_kl, sample_stats

    @functools.wraps(original)
    def compute_reward(r: torch.Tensor, kl_coef: float, log_probs: torch.Tensor, log_probs_base: torch.Tensor,
                       action_mask: Any = None) -> torch.Tensor:
        out = original(r, kl_coef, log_probs, log_probs_base, action_mask=action_mask)
        now = time.time()
        fields = {**sample_stats("reward", r), **sample_stats("kl", per_sample_kl(log_probs, log_probs_base,
                                                                                 action_mask))}
        writer.write("experience", t0=now, t1=now, samples=int(r.numel()), **fields)
        return out

    setattr(compute_reward, _INSTALLED, True)
    return compute_reward


def _recorded_forward(original: Callable[..., torch.Tensor], which: str, writer: EventWriter) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self: torch.nn.Module, first: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = original(self, first, *args, **kwargs)
        writer.write("loss", which=which, t=time.time(), value=float(loss.detach()), samples=int(first.size(0)))
        return loss

    setattr(forward, _INSTALLED, True)
    return forward


def install() -> bool:
    """Wraps ``compute_reward``, ``PolicyLoss.forward`` and ``ValueLoss.forward`` in this process while recording is
    on, right after their modules are imported (now, if they are already); returns whether recording is on.
    Idempotent. Imports nothing itself: a Ray worker runs it before the actor's ``OMP_NUM_THREADS`` is set, and
    importing torch then would give it a thread per core (7x slower legacy steps on a 2-core host)."""
    directory = events_dir()
    if not directory:
        return False
    patch_after_import({RL_FUNCTIONS: functools.partial(_wrap_compute_reward, directory),
                        LOSSES: functools.partial(_wrap_losses, directory)}, "compare recording")
    return True


def _wrap_compute_reward(directory: str) -> None:
    from coati_compat.compare.recording import EventWriter

    rl_functions = sys.modules[RL_FUNCTIONS]
    if not getattr(rl_functions.compute_reward, _INSTALLED, False):
        rl_functions.compute_reward = _recorded_compute_reward(rl_functions.compute_reward, EventWriter(directory))
        logger.debug("compare: recording compute_reward in this process")


def _wrap_losses(directory: str) -> None:
    from coati_compat.compare.recording import EventWriter

    writer, losses = EventWriter(directory), sys.modules[LOSSES]
    for cls, which in ((losses.PolicyLoss, "actor"), (losses.ValueLoss, "critic")):
        if not getattr(cls.forward, _INSTALLED, False):
            cls.forward = _recorded_forward(cls.forward, which, writer)
    logger.debug("compare: recording PolicyLoss and ValueLoss in this process")
