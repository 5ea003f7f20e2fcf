"""ColossalChat's zero-bubble entry (``coati.distributed.launch_zero_bubble.launch_distributed``) on this engine.

``from coati_relay.launch_zero_bubble import launch_distributed`` takes `coati_relay.launch.launch_distributed`'s
keywords, meaning the same, plus ``data_actor_buffer_size_limit``. The schedule is ColossalChat's:

- Producers keep generating while the consumers train, into a data buffer bounded in prompts: a producer claims
  its next micro-batch (``inference_microbatch_size`` prompts) only while fewer than ``data_actor_buffer_size_limit``
  prompts are claimed by producers or queued for the consumers, and waits for room otherwise (ColossalChat's
  ``SharedVariableActor.pickup_rollout_task``: reserved at pick-up, released when the consumers read the data).
  ``<= 0`` (the default) is twice the global mini-batch: ``2 * train_minibatch_size * num_consumer_procs``.
- Producers never wait for weights: after each inference batch of their own (``inference_batch_size`` prompts)
  they load the newest published version, if there is a newer one, and go on.
- Consumers read the buffer one micro-batch at a time (so a buffer smaller than a round still drains), train, and
  publish a new version after each round.

Here the buffer is the engine's rollout queue (`RolloutQueueActor`: ``buffer_prompts``, ``wait_room``) and the
versions are the weight store's. ``n_behind`` keeps launch_distributed's meaning when given (an int: a staleness
bound); its default here is None, no bound but the buffer's, as in ColossalChat, whose zero-bubble entry has no
such keyword. As ColossalChat's zero-bubble consumer, the optimizer has no weight decay unless
``grpo_config['weight_decay']`` is given (ColossalChat ignores it) and ColossalChat's cosine (``lr_scheduler``
'colossalchat') steps once per optimizer step. Differences from ColossalChat: its consumers publish after each
optimizer step, here after each round (``inference_batch_size * num_producers`` prompts; the same when that equals
``train_batch_size * num_consumer_procs``); the bound is not widened by DAPO's sample utilisation (no dynamic
batching here, so every buffered prompt trains); every ``core_algo`` of this engine runs (ColossalChat's zero-bubble
entry: GRPO, DAPO).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Optional

from coati_relay.assembly.build import ConfigError, build_run_config, keyword_names
from coati_relay.config.checks import is_int
from coati_relay.config.keys import IGNORED_LAUNCH_KEYS
from coati_relay.config.launch_keywords import keywords_doc
from coati_relay.config.schema import RunConfig
from coati_relay.observe.run_result import RunResult

__all__ = ["launch_distributed", "zero_bubble_config", "buffer_limit"]

log = logging.getLogger(__name__)


def buffer_limit(data_actor_buffer_size_limit: int, train_minibatch_size: int, num_consumer_procs: int) -> int:
    """The data buffer in prompts: the limit given, or for ``<= 0`` ColossalChat's default, twice the global
    mini-batch (``2 * train_minibatch_size * num_consumer_procs``; no model parallelism here, so every consumer
    rank is a data-parallel rank)."""
    if data_actor_buffer_size_limit > 0:
        return data_actor_buffer_size_limit
    return 2 * train_minibatch_size * num_consumer_procs


def zero_bubble_config(data_actor_buffer_size_limit: Any = 0, n_behind: Optional[int] = None,
                       **kwargs: Any) -> RunConfig:
    """`build_run_config` for the zero-bubble entry; raises one `ConfigError` listing every problem."""
    errors = []
    if not is_int(data_actor_buffer_size_limit):
        errors.append(f"data_actor_buffer_size_limit must be an int: the data buffer in prompts (<= 0 for the "
                      f"default, 2 * train_minibatch_size * num_consumer_procs), got "
                      f"{data_actor_buffer_size_limit!r}")
    if n_behind is not None and (not is_int(n_behind) or n_behind < 0):
        errors.append(f"n_behind must be None (the default here: staleness bounded by the data buffer alone) or an "
                      f"int >= 0 (a staleness bound in weight versions), got {n_behind!r}")
    if kwargs.get("colocate"):
        errors.append("colocate=True runs the producer and the consumer in one process, which cannot generate "
                      "while it trains: use coati_relay.launch.launch_distributed(colocate=True) for a "
                      "one-process, on-policy run, or colocate=False here")
    try:
        cfg = build_run_config(n_behind=n_behind if is_int(n_behind) and n_behind >= 0 else 0, **kwargs)
    except ConfigError as exc:
        if not errors:
            raise
        text = str(exc).split(":\n", 1)[-1]
        errors += [line[4:] if line.startswith("  - ") else line for line in text.splitlines()]
        cfg = None
    if errors:
        raise ConfigError("invalid launch configuration:\n  - " + "\n  - ".join(errors))
    limit = buffer_limit(data_actor_buffer_size_limit, cfg.batches.train_minibatch_size, cfg.roles.num_consumers)
    cfg = replace(cfg, roles=replace(cfg.roles, n_behind=n_behind, buffer_prompts=limit))
    if "weight_decay" not in (kwargs.get("grpo_config") or {}):  # its consumer gives HybridAdam none: 0
        cfg = replace(cfg, algo=replace(cfg.algo, weight_decay=0.0))
    else:
        log.warning("grpo_config['weight_decay']=%r: ColossalChat's zero-bubble consumer ignores it (its optimizer "
                    "has none); this engine applies it", cfg.algo.weight_decay)
    return cfg


def launch_distributed(**kwargs: Any) -> RunResult:
    from coati_relay.launch import run

    return run(zero_bubble_config(**kwargs))


# This entry's meaning of n_behind, where it differs from launch_distributed's.
N_BEHIND = ("extension here; ColossalChat's zero-bubble entry has no such keyword",
            "staleness bound, meant as in launch_distributed: an int k >= 0 trains only on rollouts made by weights at "
            "most k versions old (staler ones are made again) and makes producers wait for such weights; None, the "
            "default, bounds staleness by the data buffer alone, as ColossalChat does")

launch_distributed.__doc__ = keywords_doc(
    """ColossalChat's zero-bubble launch: producers keep generating into a bounded data buffer while the consumers
    train, and pick up the newest weights after each of their inference batches (see
    `coati_relay.launch_zero_bubble`). Returns a `RunResult`; its ``producer_stats`` hold each producer's idle
    seconds (``room_wait_s``: waiting for room in the buffer, ``wait_s``: for weights) and its ``task_log``, and
    each history record the consumer's wait for data (``wait_s``).""",
    [*keyword_names(), "data_actor_buffer_size_limit"],
    {k: v for k, v in IGNORED_LAUNCH_KEYS.items() if k != "data_actor_buffer_size_limit"},
    overrides={"n_behind": N_BEHIND})
