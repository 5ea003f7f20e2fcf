"""`launch_zero_bubble`: ColossalChat's zero-bubble entry point (``coati.distributed.launch_zero_bubble``) on this
engine's roles.

ColossalChat's zero-bubble variant takes `launch_distributed`'s keywords less ``n_behind``, plus
``data_actor_buffer_size_limit``: producers generate ahead of the consumers until that many prompts wait in a shared
buffer (``<= 0``, the default: ``2 * train_minibatch_size * num_consumer_procs``), so a consumer trains on rollouts
made by weights a few versions old. Here the rollout queue bounds the same thing in weight versions (``n_behind``):
the buffer's prompts over the prompts one weight version consumes (``inference_batch_size * num_producers``),
rounded up, and at least 1 (producers always run ahead).
"""
from __future__ import annotations

import math
from typing import Any

from coati_relay.config.build import ConfigError, build_run_config
from coati_relay.config.keys import IGNORED_LAUNCH_KEYS
from coati_relay.config.launch_keywords import keywords_doc
from coati_relay.config.schema import RunConfig
from coati_relay.observe.run_result import RunResult


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def versions_ahead(buffer_limit: int, inference_batch_size: int, num_producers: int, train_minibatch_size: int,
                   num_consumer_procs: int) -> int:
    """The staleness bound (``n_behind``) that a zero-bubble buffer of ``buffer_limit`` prompts allows."""
    if buffer_limit <= 0:
        buffer_limit = 2 * train_minibatch_size * num_consumer_procs
    return max(1, math.ceil(buffer_limit / (inference_batch_size * num_producers)))


def zero_bubble_config(**kwargs: Any) -> RunConfig:
    """`build_run_config` for ColossalChat's zero-bubble keywords (``data_actor_buffer_size_limit`` becomes
    ``n_behind``); raises `ConfigError`."""
    if "n_behind" in kwargs:
        raise ConfigError("launch_zero_bubble has no keyword 'n_behind': its producers run ahead as far as "
                          "data_actor_buffer_size_limit (prompts) allows; use launch_distributed for n_behind")
    if kwargs.get("colocate"):
        raise ConfigError("launch_zero_bubble runs producers ahead of the consumers, which one process cannot do: "
                          "use launch_distributed(colocate=True) for a one-process, on-policy run")
    limit = kwargs.pop("data_actor_buffer_size_limit", 0)
    if not _int(limit):
        raise ConfigError(f"data_actor_buffer_size_limit must be an int (prompts; <= 0 for 2 * train_minibatch_size "
                          f"* num_consumer_procs), got {limit!r}")
    sizes = [kwargs.get(k) for k in ("inference_batch_size", "num_producers", "train_minibatch_size",
                                     "num_consumer_procs")]
    # invalid sizes are reported by build_run_config, with the rest
    n_behind = versions_ahead(limit, *sizes) if all(_int(s) and s > 0 for s in sizes) else 1
    return build_run_config(n_behind=n_behind, **kwargs)


def launch_zero_bubble(**kwargs: Any) -> RunResult:
    from coati_relay.launch import run

    return run(zero_bubble_config(**kwargs))


launch_zero_bubble.__doc__ = keywords_doc(
    """ColossalChat's zero-bubble launch: `launch_distributed` with producers generating ahead of the consumers.

    Takes `launch_distributed`'s keywords less ``n_behind``, plus ``data_actor_buffer_size_limit`` (prompts that may
    wait for the consumers; <= 0, the default: 2 * train_minibatch_size * num_consumer_procs). That bound becomes the
    rollout queue's staleness bound in weight versions: the limit over inference_batch_size * num_producers, rounded
    up, at least 1 (see `coati_relay.zero_bubble`). Returns a `RunResult`.""",
    {k: v for k, v in IGNORED_LAUNCH_KEYS.items() if k != "data_actor_buffer_size_limit"}, skip=("n_behind",))
