"""The colocated placement: one producer and one consumer rank in the driver's process.

No Ray: no cluster, actors, queue or weight store. Each round the producer part generates the round's tasks, scores
them, and the consumer part trains on them (`ConsumerWorker.finish_round`). Prompts, scoring, training, metrics and
checkpoints are the same code as in the disaggregated run (`coati_relay.launch`), so both give the same `RunResult`.

What the inference backend's `BackendSpec` (`coati_relay.inference.registry`) says decides how it generates:

- one that ``generates_in_place`` (transformers): generation runs on the consumer's training model itself (eval
  mode, ``no_grad``; `TransformersBackend.around`), so the next round reads the trained weights in place: one copy
  of the policy, nothing published or loaded.
- any other (vLLM): the engine runs in this process with its own copy of the weights (vLLM's layers fuse q/k/v and
  gate/up, and on the CPU it packs each linear weight into its GEMM kernel's layout after loading, so it cannot read
  the training model's parameters); after each round the consumer hands the trained weights to it directly through
  the weight sync's ``colocated_publisher`` (`coati_relay.exchange.in_process.InProcessPublisher`): a copy in memory
  and the engine's reload, no serialisation or transfer. On CUDA the spec's ``fit_beside_trainer`` starts the engine,
  after the reward model, on what the trainer and that model left of the GPU, less what the optimizer state and
  gradients will take at the first step (`training_reserve_bytes`; vLLM:
  `coati_relay.inference.vllm_spec.colocated_engine_kwargs`), and it sleeps while the policy trains
  (``enable_sleep_mode``: its weights go to host memory, its KV cache is freed); the publisher wakes it before
  loading the trained weights.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict

from coati_relay.cluster.environ import restore_environ
from coati_relay.config.schema import RunConfig
from coati_relay.exchange.sync_registry import weight_sync_spec
from coati_relay.observe.interrupt import StopOnSignal, interrupted

log = logging.getLogger(__name__)


def training_reserve_bytes(backends: Dict[str, Any]) -> int:
    """What the consumer's training backends (name -> `TrainingBackend`) will add to the device from their first
    step on: `step_state_bytes` of each one's trainable parameters, under its plugin, on its one rank."""
    from coati_relay.training.step_memory import step_state_bytes, trainable_parameters

    return sum(step_state_bytes(trainable_parameters([b.unwrapped()]), b.plugin_name or "ddp", b.plugin_options)
               for b in backends.values())


def run_colocated(cfg: RunConfig, start: Dict[str, Any], hooks: Any = None) -> Any:
    """Trains rounds ``start["round"]`` .. ``cfg.total_rounds - 1`` (``start``: the state of the checkpoint resumed
    from, ``{"round": 0}`` for a fresh run); returns the run's `RunResult`.

    ``hooks``: the callbacks' `coati_relay.callbacks.Hooks`, called where each metrics line is written.
    Leaves ``os.environ`` as it found it: an engine in this process sets variables (vLLM: ``LD_PRELOAD``,
    ``LOCAL_RANK``, ``RAY_CLIENT_MODE``, inductor settings, ...) that processes started afterwards would inherit."""
    saved = dict(os.environ)
    try:
        return _run(cfg, start, hooks)
    finally:
        restore_environ(saved)


def _run(cfg: RunConfig, start: Dict[str, Any], hooks: Any) -> Any:
    from coati_relay.callbacks import Hooks
    from coati_relay.observe.evaluation import eval_metrics
    from coati_relay.observe.recorder import RunRecorder
    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.roles.producer import ProducerWorker

    hooks = hooks if hooks is not None else Hooks(cfg.callbacks)
    start_round = int(start.get("round", 0))
    t_start = time.perf_counter()
    cfg.checkpointing.run_dir.mkdir(parents=True, exist_ok=True)
    consumer = ConsumerWorker(0, cfg, queue=None, weight_store=None)
    policy = consumer.setup_colocated()
    if consumer.round != start_round:
        raise RuntimeError(f"colocated run: the checkpoint put the consumer at round {consumer.round}, the driver "
                           f"read round {start_round}; resume_from points at an inconsistent checkpoint")
    producer = ProducerWorker(0, cfg, queue=None, weight_store=None, start_version=start_round)
    producer.setup_colocated(policy, training_reserve_bytes(consumer.backends))  # the trainer loaded first
    shared = producer.backend.shared
    if not shared:
        consumer.publisher = weight_sync_spec(cfg.roles.weight_sync).colocated_publisher(producer.backend)
        if start_round:  # the engine loaded the initial checkpoint; the consumer resumed from a later one
            consumer.publisher.publish(start_round, tensors=consumer.policy.state_dict_for_inference())
    setup_s = time.perf_counter() - t_start
    recorder = RunRecorder(cfg, start, hooks)
    counters = {"produced": 0, "consumed": 0, "dropped": 0, "in_flight": 0, "produced_samples": 0,
                "consumed_samples": 0}
    stop = StopOnSignal("finishing this round and saving a checkpoint").install()
    try:
        for r in range(start_round, cfg.total_rounds):
            t0 = time.perf_counter()
            if shared:
                producer.backend.weight_version = r  # the policy holds round r's weights: trained in place
            report = producer.maybe_evaluate()
            if report is not None:
                counts = {task: tuple(ct) for task, ct in report["counts"].items()}
                recorder.evaluated(r, eval_metrics(report["training_step"], counts))
                t0 = time.perf_counter()  # the round's time leaves the evaluation out
            tasks = range(r * cfg.tasks_per_round, (r + 1) * cfg.tasks_per_round)
            made = [producer.make_rollout(task) for task in tasks]
            producer.backend.sleep()  # vLLM hands its GPU memory to training; the publisher wakes it
            rollouts = [rollout for rollout, _ in made]
            metrics = consumer.finish_round(rollouts, [meta for _, meta in made], [r] * len(made), t0,
                                            wait_s=time.perf_counter() - t0)
            prompts = sum(x.num_prompts for x in rollouts)
            for key in ("produced", "consumed"):
                counters[key] += len(made)
                counters[f"{key}_samples"] += prompts
            if recorder.round_end(metrics) or stop.requested:
                if "checkpoint" not in metrics:
                    metrics["checkpoint"] = consumer.save(consumer.round)
                    hooks.checkpoint(consumer.round, metrics["checkpoint"])
                break
    finally:
        stop.restore()
        recorder.close()
        producer.backend_close()
        producer.profiler.close()
        consumer.profiler.close()
    if stop.requested and consumer.round < cfg.total_rounds:
        raise interrupted(cfg.checkpointing.run_dir, cfg.checkpointing.save_dir)
    wall_s = time.perf_counter() - t_start - setup_s
    log.info("colocated run %s: %d rounds in %.1fs after %.1fs of set-up", cfg.project_name, len(recorder.history),
             wall_s, setup_s)
    return recorder.result(setup_s, wall_s, counters=counters, producer_stats=[dict(producer.stats)])
