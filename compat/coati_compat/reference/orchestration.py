"""Reference legacy orchestration as pure functions (legacy_spec §A.3-§A.5): the order of the trainer's ``fit``
events, the maker's ``workingloop`` events and batch count, the routing of items to trainers and the calls of
one weight push. Event lists are ``(name, argument)`` pairs (argument: episode, epoch or None).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

Event = Tuple[str, Optional[int]]


def fit_events(total_steps: int, update_steps: int, train_epochs: int = 1) -> List[Event]:
    """Callbacks and actions of ``DetachedTrainer.fit``: ``buffer_sample`` and ``training_step`` mark a batch taken
    from the buffer and a training step; ``update_remote_makers`` the weight push at the end of an episode."""
    events: List[Event] = [("on_fit_start", None)]
    for episode in range(total_steps // update_steps):
        events.append(("on_episode_start", episode))
        events.append(("on_epoch_start", 0))
        for _ in range(update_steps):
            events += [("buffer_sample", None), ("on_batch_start", None), ("training_step", 0),
                       ("on_batch_end", None)]
        events.append(("on_epoch_end", 0))
        for epoch in range(1, train_epochs):
            events.append(("on_epoch_start", epoch))
            for _ in range(update_steps):
                events += [("on_batch_start", None), ("training_step", epoch), ("on_batch_end", None)]
            events.append(("on_epoch_end", epoch))
        events += [("on_update_start", None), ("update_remote_makers", None), ("on_update_end", None),
                   ("on_episode_end", episode)]
    events.append(("on_fit_end", None))
    return events


def workingloop_batches(batches_per_epoch: int, num_epochs: int = 1, num_steps: int = 0) -> int:
    """Batches a maker processes: exactly ``num_steps`` when > 0 (the loader restarts), else full epochs."""
    return num_steps if num_steps > 0 else batches_per_epoch * num_epochs


def workingloop_events(num_batches: int) -> List[Event]:
    """Callbacks and actions of ``ExperienceMakerHolder.workingloop`` over ``num_batches`` batches."""
    per_batch: List[Event] = [("on_batch_start", None), ("on_make_experience_start", None),
                              ("make_experience", None), ("on_make_experience_end", None), ("on_send_start", None),
                              ("send_items", None), ("on_send_end", None), ("on_batch_end", None)]
    return [("on_loop_start", None)] + per_batch * num_batches + [("on_loop_end", None)]


def route_items(items_per_call: List[int], num_trainers: int, start_idx: int = 0) -> Tuple[List[List[int]], int]:
    """Per-item round robin of a maker: the trainer index of every item of every ``_send_items`` call, and the
    index the next call starts at (it persists across calls)."""
    routes = []
    idx = start_idx
    for count in items_per_call:
        routes.append([(idx + j) % num_trainers for j in range(count)])
        idx = (idx + count) % num_trainers
    return routes, idx


def weight_push_calls(fully_update: bool, num_actor_shards: int, num_critic_shards: int) -> List[Dict[str, Any]]:
    """The ``update_experience_maker`` calls one holder receives in one push, in order (payloads as indices)."""
    calls: List[Dict[str, Any]] = [{"chunk_start": True, "fully_update": fully_update}]
    calls += [{"new_actor_state_dict": i, "fully_update": fully_update} for i in range(num_actor_shards)]
    calls += [{"new_critic_state_dict": i, "fully_update": fully_update} for i in range(num_critic_shards)]
    calls.append({"chunk_end": True, "fully_update": fully_update})
    return calls
