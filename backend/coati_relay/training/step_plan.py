"""The consumers agree on an optimizer step before they run it.

Each rank's backward passes are collectives (the plugins average gradients over the group), so ranks that run
different numbers of them, or train different models, wait on each other for ever. Before a step's first backward
pass, one small all-gather compares every rank's plan; where they differ, the run ends with `PlanMismatch` naming
each rank's plan, instead of a collective that cannot complete.
"""
from __future__ import annotations

from typing import List, NamedTuple

import torch
import torch.distributed as dist


class StepPlan(NamedTuple):
    """What one rank is about to do in an optimizer step."""

    micro_batches: int  # backward passes of the step (forward chunks)
    policy_trains: bool  # the policy runs backward and steps
    critic_trains: bool  # the critic runs backward and steps
    optimizer_steps: int  # optimizer steps of the round (ppo_epochs passes of train_batch_size prompts)

    def describe(self) -> str:
        return (f"{self.micro_batches} micro-batch(es), policy {'trains' if self.policy_trains else 'skips'}, critic "
                f"{'trains' if self.critic_trains else 'none'}, {self.optimizer_steps} optimizer step(s) this round")


class PlanMismatch(RuntimeError):
    """The ranks of the consumers' group disagree on a step; the message names each rank's plan."""


def agree_on_plan(plan: StepPlan, rank: int, round_: int, step: int) -> None:
    """All-gathers ``plan`` (int64 [4] a rank) over the default group; raises `PlanMismatch` where ranks differ.
    A no-op without a group of more than one rank. A collective: every rank calls it before the step's backward."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    from coati_relay.cluster.devices import accelerator_device

    device = accelerator_device() if dist.get_backend() == "nccl" else "cpu"
    mine = torch.tensor([int(v) for v in plan], dtype=torch.int64, device=device)
    gathered: List[torch.Tensor] = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    plans = [StepPlan(*(int(v) for v in t.tolist())) for t in gathered]
    plans = [StepPlan(p.micro_batches, bool(p.policy_trains), bool(p.critic_trains), p.optimizer_steps)
             for p in plans]
    if any(p != plans[0] for p in plans):
        lines = "; ".join(f"rank {r}: {p.describe()}" for r, p in enumerate(plans))
        raise PlanMismatch(f"consumer rank {rank}: the ranks disagree on optimizer step {step} of round {round_} "
                           f"and would wait on each other's collectives for ever: {lines}. Each rank must receive "
                           f"as many rollout rows as the others (the same train_batch_size, num_generations and "
                           f"models on every rank)")
