"""``colocate``: the producer and the consumer in one process (`coati_relay.roles.colocated`).

What a colocated run cannot serve is refused here, in the driver, with the setting to change: it has one process
holding one producer and one consumer rank, generates with the policy being trained (so from the same checkpoint;
with a backend that generates in place, the training model itself, in its dtype), and has no weights to send to
another process. What each inference backend and weight sync can do here comes from its spec.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, List

from coati_relay.config.schema import Models, Plugin, Roles
from coati_relay.exchange.sync_registry import find_weight_sync
from coati_relay.inference.registry import find_backend


def check_colocate(errors: List[str], colocate: Any, roles: Roles, models: Models, plugin: Plugin) -> bool:
    """Appends an error per setting a colocated run cannot honour; returns ``colocate`` as a bool."""
    if not isinstance(colocate, bool):
        errors.append(f"colocate must be a bool (True: producer and consumer share one process and one copy of the "
                      f"policy; False: separate Ray actors), got {colocate!r}")
        return False
    if not colocate:
        return False
    fix = "or use colocate=False"
    if roles.num_producers != 1 or roles.num_consumers != 1:
        errors.append(f"colocate=True runs one producer and one consumer in one process; more ranks are not "
                      f"implemented yet (got num_producers={roles.num_producers}, num_consumer_procs="
                      f"{roles.num_consumers}): set both to 1, {fix}")
    sync = find_weight_sync(roles.weight_sync)
    if sync is None or sync.colocated_publisher is None:
        errors.append(f"weight_sync={roles.weight_sync!r} sends weights to producer processes, which a colocated "
                      f"run has none of (generation reads the trained weights in place): leave weight_sync at "
                      f"'object_store', {fix}")
    if roles.n_behind:
        errors.append(f"n_behind={roles.n_behind} lets producers generate while consumers train, which one process "
                      f"cannot do: a colocated run is on-policy (n_behind=0), {fix}")
    if roles.on_producer_failure != "fail":
        errors.append(f"on_producer_failure={roles.on_producer_failure!r} needs other producers to take over; a "
                      f"colocated run has one: leave it at 'fail', {fix}")
    paths = [Path(p).resolve() for p in (models.model_path, models.train_path) if p]
    if len(paths) == 2 and paths[0] != paths[1]:
        errors.append(f"colocate=True generates with the model being trained, so inference_model_config['path'] "
                      f"({models.model_path}) must be train_model_config['path'] ({models.train_path}): give one "
                      f"path, {fix}")
    backend = find_backend(roles.inference_backend)
    in_place = backend is not None and backend.generates_in_place
    module_keys = sorted(set(models.inference_model_kwargs) - set(backend.in_place_keys)) if in_place else []
    if module_keys:
        errors.append(f"colocate=True with inference_backend {backend.name!r} generates with the training model "
                      f"itself (its device and dtype), so inference_model_config takes only 'path' and "
                      f"{' and '.join(repr(k) for k in backend.in_place_keys)}; got {module_keys}: drop them, {fix}")
    if models.lora:
        errors.append(f"colocate=True with train_model_config['lora'] is not implemented yet: train the full model, "
                      f"{fix}")
    if plugin.name == "gemini" and in_place:
        errors.append(f"plugin 'gemini' keeps the policy's parameters in its own chunks, which generation cannot "
                      f"read in place: use plugin 'ddp' or 'zero2' with colocate=True and inference_backend "
                      f"{roles.inference_backend!r}, {fix}")
    return True
