"""The engine's published parts: the one door through which the legacy layer (`coati_compat`) reaches the engine
beyond `coati_relay`'s own exports. `tests/unit/test_layering.py` refuses any deeper import from compat.

Names resolve lazily on first use (the legacy import finder runs in every interpreter and must stay cheap).
"""
from __future__ import annotations

import importlib
from typing import Any, Dict

# name -> module that defines it
_PARTS: Dict[str, str] = {
    # algorithms: the losses and estimators the legacy trainer and experience maker compute with
    "kl_k3": "coati_relay.algorithms",
    "masked_mean": "coati_relay.algorithms",
    "policy_loss": "coati_relay.algorithms",
    "value_loss": "coati_relay.algorithms",
    "response_mask": "coati_relay.rollout",
    "get_reward_fn": "coati_relay.rewards",
    # config: the algorithm keys' checks and defaults (the rewriter's default learning rate), and their predicates
    "ALGORITHM_KEYS": "coati_relay.config.algorithm",
    "is_positive": "coati_relay.config.checks",
    # training: the one place that builds a Booster, steps, saves and gathers
    "TrainingBackend": "coati_relay.training.booster_backend",
    "BackendSet": "coati_relay.training.backend_set",
    "PLUGINS": "coati_relay.training.plugins",
    "build_optimizer": "coati_relay.training.plugins",
    "resolve_plugin": "coati_relay.training.plugins",
    "refusal": "coati_relay.training.gemini_guards",
    "releases_parameters": "coati_relay.training.gemini_guards",
    "free_port": "coati_relay.training.distributed",
    "init_process_group_from_env": "coati_relay.training.distributed",
    "announce_member": "coati_relay.training.rendezvous",
    "state_dict_shards": "coati_relay.training.state_dict_shards",
    "save_file": "coati_relay.training.checkpoint_files",
    # inference: sampling on a module the legacy maker holds, and vLLM's sizes
    "SamplingConfig": "coati_relay.config.schema",
    "backend_spec": "coati_relay.inference",
    "build_backend_on_module": "coati_relay.inference",
    "resolve_backend_name": "coati_relay.inference",
    "NoRoomForEngine": "coati_relay.inference.gpu_share",
    "parameter_bytes": "coati_relay.inference.gpu_share",
    "shared_gpu_engine_kwargs": "coati_relay.inference.gpu_share",
    "kv_bytes_per_token": "coati_relay.inference.kv_cache_size",
    "module_weights": "coati_relay.inference.module_checkpoint",
    "DEFAULT_MAX_MODEL_LEN": "coati_relay.inference.vllm_backend",
    # exchange: the queue and the weight packing the legacy actors share with the engine
    "LocalRolloutQueue": "coati_relay.exchange.queue",
    "QueueEntry": "coati_relay.exchange.queue",
    "lora_delta": "coati_relay.exchange.lora_deltas",
    "put_packed": "coati_relay.exchange.packing",
    "unwired": "coati_relay.exchange.wire",
    "wired_fields": "coati_relay.exchange.wire",
    "replace_delta": "coati_relay.exchange.lora_deltas",
    # cluster: devices, bounded waits, liveness, the local cluster a run starts
    "accelerator_device": "coati_relay.cluster.devices",
    "get_within": "coati_relay.cluster.waiting",
    "LivenessProbe": "coati_relay.cluster.liveness",
    "NoProducersError": "coati_relay.cluster.liveness",
    "ProducerRoster": "coati_relay.cluster.liveness",
    "seed_everything": "coati_relay.roles.seeding",
    "start_local_ray": "coati_relay.cluster.local_ray",
    # observe: metrics and trackers
    "MetricsLogger": "coati_relay.observe.metrics",
    "read_metrics": "coati_relay.observe.metrics",
    "run_summary": "coati_relay.observe.metrics",
    "TensorBoardTracker": "coati_relay.observe.trackers",
    "write_toy_dataset": "coati_relay.toy",
}

# name -> a module published whole
_MODULES: Dict[str, str] = {"checkpoint_files": "coati_relay.training.checkpoint_files",
                            "from_legacy": "coati_relay.migration.from_legacy"}

__all__ = sorted([*_PARTS, *_MODULES])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _PARTS:
        value = getattr(importlib.import_module(_PARTS[name]), name)
    else:
        raise AttributeError(f"coati_relay.parts has no {name!r}; the published parts are: {', '.join(__all__)}")
    globals()[name] = value
    return value
