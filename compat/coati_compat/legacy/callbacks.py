"""Legacy ``coati.ray.callbacks``: the trainer and maker hooks and the two performance evaluators.

The evaluators sum their timings over the data-parallel group when torch.distributed is initialised and work on
one process otherwise. Rank 0 prints the summary (the legacy report); the numbers are also kept in ``summary``.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.experience import Experience


@deprecated_api("coati.ray.callbacks.TrainerCallback")
class TrainerCallback:
    """Hooks of ``DetachedTrainer.fit``; every hook does nothing by default."""

    def on_fit_start(self) -> None:
        pass

    def on_fit_end(self) -> None:
        pass

    def on_episode_start(self, episode: int) -> None:
        pass

    def on_episode_end(self, episode: int) -> None:
        pass

    def on_epoch_start(self, epoch: int) -> None:
        pass

    def on_epoch_end(self, epoch: int) -> None:
        pass

    def on_batch_start(self) -> None:
        pass

    def on_batch_end(self, metrics: Dict[str, Any], experience: Experience) -> None:
        pass

    def on_update_start(self) -> None:
        pass

    def on_update_end(self) -> None:
        pass


@deprecated_api("coati.ray.callbacks.MakerCallback")
class MakerCallback:
    """Hooks of ``ExperienceMakerHolder.workingloop``; every hook does nothing by default."""

    def on_loop_start(self) -> None:
        pass

    def on_loop_end(self) -> None:
        pass

    def on_make_experience_start(self) -> None:
        pass

    def on_make_experience_end(self, experience: Experience) -> None:
        pass

    def on_send_start(self) -> None:
        pass

    def on_send_end(self) -> None:
        pass

    def on_batch_start(self) -> None:
        pass

    def on_batch_end(self) -> None:
        pass


class Timer:
    """Accumulates the duration of start/end intervals (synchronising CUDA when it is in use)."""

    def __init__(self) -> None:
        self.duration = 0.0
        self._start: Optional[float] = None

    @staticmethod
    def _now() -> float:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self) -> None:
        self._start = self._now()

    def end(self) -> None:
        if self._start is None:
            raise RuntimeError("Timer.end() called without start()")
        self.duration += self._now() - self._start
        self._start = None


def _group_sum(values: Dict[str, float]) -> Dict[str, float]:
    """Sums each value over the process group when torch.distributed is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return dict(values)
    tensor = torch.tensor(list(values.values()), dtype=torch.float64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor)
    return dict(zip(values, tensor.cpu().tolist()))


def _world_and_rank() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _report(title: str, summary: Dict[str, float]) -> None:
    """Prints the summary on rank 0: the user-facing output of the legacy evaluators."""
    if _world_and_rank()[1] == 0:
        body = ", ".join(f"{k}: {v:.4g}" for k, v in summary.items())
        print(f"[{title}] {body}", flush=True)


@deprecated_api("coati.ray.callbacks.ExperienceMakerPerformanceEvaluator")
class ExperienceMakerPerformanceEvaluator(MakerCallback):
    """Throughput and TFLOPS of a maker. FLOPs per batch (B samples of S tokens, A of them generated):
    generation ``2 N_actor B (S - A + S - 1) A / 2`` plus one forward ``2 N B S`` of each of the four models."""

    def __init__(self, actor_num_params: int, critic_num_params: int, initial_model_num_params: int,
                 reward_model_num_params: int) -> None:
        super().__init__()
        self.actor_num_params = actor_num_params
        self.forward_num_params = (actor_num_params + critic_num_params + initial_model_num_params
                                   + reward_model_num_params)
        self.batch_timer, self.send_timer, self.make_experience_timer = Timer(), Timer(), Timer()
        self.total_samples = 0
        self.make_experience_flop = 0
        self.summary: Dict[str, float] = {}

    def on_make_experience_start(self) -> None:
        self.make_experience_timer.start()

    def on_make_experience_end(self, experience: Experience) -> None:
        self.make_experience_timer.end()
        batch_size, seq_len = experience.sequences.shape
        num_actions = experience.action_log_probs.size(1)
        input_len = seq_len - num_actions
        self.total_samples += batch_size
        generation = 2 * self.actor_num_params * batch_size * (input_len + seq_len - 1) * num_actions / 2
        self.make_experience_flop += generation + 2 * self.forward_num_params * batch_size * seq_len

    def on_send_start(self) -> None:
        self.send_timer.start()

    def on_send_end(self) -> None:
        self.send_timer.end()

    def on_batch_start(self) -> None:
        self.batch_timer.start()

    def on_batch_end(self) -> None:
        self.batch_timer.end()

    def on_loop_end(self) -> None:
        world_size, _ = _world_and_rank()
        totals = _group_sum({"batch": self.batch_timer.duration, "send": self.send_timer.duration,
                             "make_experience": self.make_experience_timer.duration,
                             "samples": float(self.total_samples), "flop": float(self.make_experience_flop)})
        per_rank_time = totals["batch"] / world_size
        self.summary = {
            "samples": totals["samples"],
            "throughput_samples_per_s": totals["samples"] / per_rank_time if per_rank_time > 0 else 0.0,
            "tflops_per_rank": totals["flop"] / (per_rank_time * world_size * 1e12) if per_rank_time > 0 else 0.0,
            "time_s": per_rank_time,
            "make_experience_s": totals["make_experience"] / world_size,
            "send_s": totals["send"] / world_size,
        }
        _report("maker performance", self.summary)


@deprecated_api("coati.ray.callbacks.TrainerPerformanceEvaluator")
class TrainerPerformanceEvaluator(TrainerCallback):
    """Throughput and TFLOPS of a trainer, skipping the first ``ignore_first_episodes`` episodes. FLOPs per batch
    (B samples of S tokens): ``2 N B S (3 + grad_checkpoint)`` for the actor and for the critic."""

    def __init__(self, actor_num_params: int, critic_num_params: int, enable_grad_checkpoint: bool = False,
                 ignore_first_episodes: int = 1) -> None:
        super().__init__()
        self.actor_num_params = actor_num_params
        self.critic_num_params = critic_num_params
        self.enable_grad_checkpoint = enable_grad_checkpoint
        self.ignore_first_episodes = ignore_first_episodes
        self.ignore_this_episode = False
        self.batch_timer, self.update_timer = Timer(), Timer()
        self.total_samples = 0
        self.flop = 0
        self.summary: Dict[str, float] = {}

    def on_episode_start(self, episode: int) -> None:
        self.ignore_this_episode = episode < self.ignore_first_episodes

    def on_batch_start(self) -> None:
        if not self.ignore_this_episode:
            self.batch_timer.start()

    def on_batch_end(self, metrics: Dict[str, Any], experience: Experience) -> None:
        if self.ignore_this_episode:
            return
        self.batch_timer.end()
        batch_size, seq_len = experience.sequences.shape
        self.total_samples += batch_size
        factor = 2 * batch_size * seq_len * (3 + int(self.enable_grad_checkpoint))
        self.flop += factor * (self.actor_num_params + self.critic_num_params)

    def on_update_start(self) -> None:
        if not self.ignore_this_episode:
            self.update_timer.start()

    def on_update_end(self) -> None:
        if not self.ignore_this_episode:
            self.update_timer.end()

    def on_fit_end(self) -> None:
        if self.total_samples == 0:
            self.summary = {}
            if _world_and_rank()[1] == 0:
                print("[trainer performance] No samples are collected, skip trainer performance evaluation",
                      flush=True)
            return
        world_size, _ = _world_and_rank()
        totals = _group_sum({"batch": self.batch_timer.duration, "update": self.update_timer.duration,
                             "samples": float(self.total_samples), "flop": float(self.flop)})
        per_rank_time = (totals["batch"] + totals["update"]) / world_size
        self.summary = {
            "samples": totals["samples"],
            "throughput_samples_per_s": totals["samples"] / per_rank_time if per_rank_time > 0 else 0.0,
            "tflops_per_rank": totals["flop"] / (per_rank_time * world_size * 1e12) if per_rank_time > 0 else 0.0,
            "time_s": per_rank_time,
            "train_s": totals["batch"] / world_size,
            "update_s": totals["update"] / world_size,
        }
        _report("trainer performance", self.summary)
