"""The colocated placement: one producer and one consumer rank in the driver's process (`ColocatedRoles`).

No Ray: no cluster, actors or object store. The roles run the loops of a disaggregated run with in-process handles
in place of the actors (`coati_relay.exchange.in_process`): the consumer's `ConsumerWorker.run` asks the
`InProcessQueue` for each round's rollouts, the queue has the producer make them (`ProducerWorker.work_once`: its
task, scoring and evaluation), and the driver (`coati_relay.launch.run`) records the rounds, gives each round's
verdict (a hook's stop, or a signal's) and builds the `RunResult`. One thread: generation and training take turns,
as the on-policy run (``n_behind=0``) needs.

What the inference backend's `BackendSpec` (`coati_relay.inference.registry`) says decides how it generates:

- one that ``generates_in_place`` (transformers): generation runs on the consumer's training model itself (eval
  mode, ``no_grad``; `TransformersBackend.around`), so the next round reads the trained weights in place: one copy
  of the policy, nothing published or loaded (the producer takes each version with no tensors,
  `coati_relay.exchange.in_process.TrainedVersions`).
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

import gc
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from coati_relay.cluster.environ import restore_environ
from coati_relay.cluster.heap import trim_heap
from coati_relay.config.schema import RunConfig
from coati_relay.exchange.in_process import InProcessQueue, TrainedVersions
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
    ``start`` (``{"round": 0}`` for a fresh run), with the queue's ``bounds`` (`coati_relay.launch.queue_bounds`),
    for the driver: `start`, `train`, `verdict`, `interrupted`, `close`, then `stop_checkpoint`, `signalled` and
    `result_fields`, as `coati_relay.launch.ActorRoles`.

    Leaves ``os.environ`` as it found it (`close`): an engine in this process sets variables (vLLM: ``LD_PRELOAD``,
    ``LOCAL_RANK``, ``RAY_CLIENT_MODE``, inductor settings, ...) that processes started afterwards would inherit.
    The first Ctrl-C or SIGTERM finishes the round, saves a checkpoint and stops (`StopOnSignal`, at the round's
    verdict: `RunConfig.verdict_each_round`)."""

    def __init__(self, cfg: RunConfig, start: Dict[str, Any], bounds: Dict[str, Any]) -> None:
        self.cfg = cfg
        self.start_round = int(start.get("round", 0))
        self.bounds = bounds
        self.environ = dict(os.environ)
        self.signal: Optional[StopOnSignal] = None  # installed while the rounds run
        self.results: Dict[str, Any] = {}  # what the consumer's loop returned
        self.counters: Dict[str, Any] = {}  # the queue's, as the loop ended
        self.producer_stats: List[Dict[str, Any]] = []  # the producer's, as it closed

    def start(self) -> None:
        """Loads the consumer (its policy first), then the producer beside it, around the in-process queue."""
        from coati_relay.roles.consumer import ConsumerWorker
        from coati_relay.roles.producer import ProducerWorker

        cfg, start_round = self.cfg, self.start_round
        cfg.checkpointing.run_dir.mkdir(parents=True, exist_ok=True)
        self.queue = queue = InProcessQueue(lambda: self.producer.work_once(), self._rest,
                                            **self.bounds, total_tasks=cfg.total_rounds * cfg.tasks_per_round,
                                            first_task=start_round * cfg.tasks_per_round)
        self.consumer = consumer = ConsumerWorker(0, cfg, queue=queue, weight_store=None)
        policy = consumer.setup_colocated()
        if consumer.round != start_round:
            raise RuntimeError(f"colocated run: the checkpoint put the consumer at round {consumer.round}, the "
                               f"driver read round {start_round}; resume_from points at an inconsistent checkpoint")
        self.producer = producer = ProducerWorker(0, cfg, queue=queue, start_version=start_round,
                                                  weight_store=TrainedVersions(lambda: consumer.round))
        producer.setup_colocated(policy, training_reserve_bytes(consumer.backends))  # the trainer loaded first
        if not producer.backend.shared:
            consumer.publisher = weight_sync_spec(cfg.roles.weight_sync).colocated_publisher(producer.backend)
            if start_round:  # the engine loaded the initial checkpoint; the consumer resumed from a later one
                consumer.publisher.publish(start_round, tensors=consumer.policy.state_dict_for_inference())

    def _rest(self) -> None:
        """Between generating and training: the engine frees what decoding holds, and what generation freed leaves
        the RSS (`trim_heap`) rather than sit beside the training step's own allocations, which the C library takes
        from fresh pages when they are large (on a 494M model, 0.4-0.7 GB of the step's peak)."""
        self.producer.backend.sleep()
        trim_heap()

    def train(self, on_report: Callable[[Dict[str, Any]], None]) -> None:
        """Runs the consumer's loop, passing each evaluation report and round record to ``on_report``, until the
        last round or a stop (`verdict`)."""
        self.signal = StopOnSignal("finishing this round and saving a checkpoint").install()
        self.queue.on_report = on_report
        self.results = self.consumer.run()
        self.counters = self.queue.counters()

    def verdict(self, step: int, stop: bool) -> None:
        """The driver's word on the round that ended at ``step``: True, or a signal since, stops the run there."""
        self.queue.set_verdict(step, stop or self.signal.requested)

    def interrupted(self) -> None:
        """A second signal: nothing to add, `close` stops what runs as on any way out."""

    def close(self) -> None:
        """Puts back the signal handlers and ``os.environ``; closes the queue, the engine and the profilers, and lets
        the roles go: what the driver does next (exporting the final policy) does not hold the training state
        beside its own copy (a 494M model: 12.8 GB at the export before, the state's 8 GB of it)."""
        try:
            if self.signal is not None:
                self.signal.restore()
                self.queue.close("the run ended")
                self.producer.backend_close()
                self.producer.profiler.close()
                self.consumer.profiler.close()
                self.producer_stats = [dict(self.producer.stats)]
                self.producer = self.consumer = None
                gc.collect()  # the optimizer, the Booster and the model hold each other
                trim_heap()
        finally:
            restore_environ(self.environ)

    def stop_checkpoint(self) -> Optional[Tuple[int, str]]:
        """(step, path) of the checkpoint the run's stop saved or found; None where it ran to its end."""
        path = self.results.get("checkpoint")
        return (self.results["last_round"], path) if path else None

    def signalled(self) -> bool:
        """True where a signal stopped the run before its last round."""
        return (self.signal is not None and self.signal.requested
                and self.results.get("last_round", 0) < self.cfg.total_rounds)

    def result_fields(self, rounds: int, setup_s: float, train_s: float) -> Dict[str, Any]:
        """The `RunResult` fields of this placement, with a log line of the run's ``rounds`` and times."""
        log.info("colocated run %s: %d rounds in %.1fs after %.1fs of set-up", self.cfg.project_name, rounds,
                 train_s, setup_s)
        return {"counters": self.counters, "producer_stats": self.producer_stats}
