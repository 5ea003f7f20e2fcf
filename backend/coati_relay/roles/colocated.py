"""The colocated placement: one producer and one consumer rank in the driver's process (`ColocatedRoles`).

No Ray: no cluster, actors, queue or weight store. Each round the producer part generates the round's tasks, scores
them, and the consumer part trains on them (`ConsumerWorker.finish_round`). The driver (`coati_relay.launch.run`) is
the disaggregated run's: it records the rounds, evaluations and the checkpoint a stop saves, and builds the
`RunResult`; prompts, scoring, training, metrics and checkpoints are the same code in both placements.

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
from typing import Any, Callable, Dict, Optional, Tuple

from coati_relay.cluster.environ import restore_environ
from coati_relay.config.schema import RunConfig
from coati_relay.exchange.sync_registry import weight_sync_spec
from coati_relay.observe.interrupt import StopOnSignal

log = logging.getLogger(__name__)


def training_reserve_bytes(backends: Dict[str, Any]) -> int:
    """What the consumer's training backends (name -> `TrainingBackend`) will add to the device from their first
    step on: `step_state_bytes` of each one's trainable parameters, under its plugin, on its one rank."""
    from coati_relay.training.step_memory import step_state_bytes, trainable_parameters

    return sum(step_state_bytes(trainable_parameters([b.unwrapped()]), b.plugin_name or "ddp", b.plugin_options)
               for b in backends.values())


class ColocatedRoles:
    """The roles of a colocated run (`coati_relay.config.schema.RunConfig`) resumed from the checkpoint state
    ``start`` (``{"round": 0}`` for a fresh run), for the driver: `start`, `train`, `verdict`, `interrupted`,
    `close`, then `stop_checkpoint`, `signalled` and `result_fields`.

    Leaves ``os.environ`` as it found it (`close`): an engine in this process sets variables (vLLM: ``LD_PRELOAD``,
    ``LOCAL_RANK``, ``RAY_CLIENT_MODE``, inductor settings, ...) that processes started afterwards would inherit.
    The first Ctrl-C or SIGTERM finishes the round, saves a checkpoint and stops (`StopOnSignal`)."""

    def __init__(self, cfg: RunConfig, start: Dict[str, Any]) -> None:
        self.cfg = cfg
        self.start_round = int(start.get("round", 0))
        self.environ = dict(os.environ)
        self.signal: Optional[StopOnSignal] = None  # installed while the rounds run
        self.stopping = False  # a hook asked the run to stop at the round just recorded
        self.stopped_at: Optional[Tuple[int, str]] = None  # (step, checkpoint) a stop saved
        self.counters = {"produced": 0, "consumed": 0, "dropped": 0, "in_flight": 0, "produced_samples": 0,
                         "consumed_samples": 0}

    def start(self) -> None:
        """Loads the consumer (its policy first), then the producer beside it."""
        from coati_relay.roles.consumer import ConsumerWorker
        from coati_relay.roles.producer import ProducerWorker

        cfg, start_round = self.cfg, self.start_round
        cfg.checkpointing.run_dir.mkdir(parents=True, exist_ok=True)
        self.consumer = consumer = ConsumerWorker(0, cfg, queue=None, weight_store=None)
        policy = consumer.setup_colocated()
        if consumer.round != start_round:
            raise RuntimeError(f"colocated run: the checkpoint put the consumer at round {consumer.round}, the "
                               f"driver read round {start_round}; resume_from points at an inconsistent checkpoint")
        self.producer = producer = ProducerWorker(0, cfg, queue=None, weight_store=None, start_version=start_round)
        producer.setup_colocated(policy, training_reserve_bytes(consumer.backends))  # the trainer loaded first
        if not producer.backend.shared:
            consumer.publisher = weight_sync_spec(cfg.roles.weight_sync).colocated_publisher(producer.backend)
            if start_round:  # the engine loaded the initial checkpoint; the consumer resumed from a later one
                consumer.publisher.publish(start_round, tensors=consumer.policy.state_dict_for_inference())

    def train(self, on_report: Callable[[Dict[str, Any]], None]) -> None:
        """Runs the rounds, passing each evaluation report and round record to ``on_report``, until the last round,
        a stop (`verdict`) or a signal; a stop after a round that saved no checkpoint saves one."""
        cfg, producer, consumer = self.cfg, self.producer, self.consumer
        self.signal = StopOnSignal("finishing this round and saving a checkpoint").install()
        for r in range(self.start_round, cfg.total_rounds):
            t0 = time.perf_counter()
            if producer.backend.shared:
                producer.backend.weight_version = r  # the policy holds round r's weights: trained in place
            report = producer.maybe_evaluate()
            if report is not None:
                on_report(report)
                t0 = time.perf_counter()  # the round's time leaves the evaluation out
            tasks = range(r * cfg.tasks_per_round, (r + 1) * cfg.tasks_per_round)
            made = [producer.make_rollout(task) for task in tasks]
            producer.backend.sleep()  # vLLM hands its GPU memory to training; the publisher wakes it
            rollouts = [rollout for rollout, _ in made]
            metrics = consumer.finish_round(rollouts, [meta for _, meta in made], [r] * len(made), t0,
                                            wait_s=time.perf_counter() - t0)
            prompts = sum(x.num_prompts for x in rollouts)
            for key in ("produced", "consumed"):
                self.counters[key] += len(made)
                self.counters[f"{key}_samples"] += prompts
            on_report(metrics)
            if self.stopping or self.signal.requested:
                if "checkpoint" not in metrics:
                    self.stopped_at = consumer.round, consumer.save(consumer.round)
                break

    def verdict(self, step: int, stop: bool) -> None:
        """The driver's word on the round that ended at ``step``: True stops the run there."""
        self.stopping = stop

    def interrupted(self) -> None:
        """A second signal: nothing to add, `close` stops what runs as on any way out."""

    def close(self) -> None:
        """Puts back the signal handlers and ``os.environ``; closes the engine and the profilers once trained."""
        try:
            if self.signal is not None:
                self.signal.restore()
                self.producer.backend_close()
                self.producer.profiler.close()
                self.consumer.profiler.close()
        finally:
            restore_environ(self.environ)

    def stop_checkpoint(self) -> Optional[Tuple[int, str]]:
        """(step, path) of the checkpoint a stop saved after a round that saved none; None otherwise."""
        return self.stopped_at

    def signalled(self) -> bool:
        """True where a signal stopped the run before its last round."""
        return self.signal is not None and self.signal.requested and self.consumer.round < self.cfg.total_rounds

    def result_fields(self, rounds: int, setup_s: float, train_s: float) -> Dict[str, Any]:
        """The `RunResult` fields of this placement, with a log line of the run's ``rounds`` and times."""
        log.info("colocated run %s: %d rounds in %.1fs after %.1fs of set-up", self.cfg.project_name, rounds,
                 train_s, setup_s)
        return {"counters": self.counters, "producer_stats": [dict(self.producer.stats)]}
