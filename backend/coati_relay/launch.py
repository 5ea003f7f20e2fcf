"""`launch_distributed`: ColossalChat's entry point, on Ray, returning a `RunResult` instead of None.

With ``colocate=True`` the roles run in the driver's process instead (`coati_relay.roles.colocated`): no Ray at
all. Either way one driver (`run`) records the rounds, ends the run and builds its result.

The driver validates the whole configuration first, then starts the queue, the weight store, the consumers and
the producers, and supervises them: every wait has a timeout, and a dead actor ends the run within seconds with an
error that names it (or, with ``on_producer_failure="continue"``, its tasks go to the surviving producers).
"""
from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from coati_relay.assembly.build import ConfigError, build_run_config, keyword_names
from coati_relay.cluster.environ import restore_environ
from coati_relay.config.keys import IGNORED_LAUNCH_KEYS
from coati_relay.config.launch_keywords import keywords_doc
from coati_relay.config.schema import RunConfig
from coati_relay.observe.interrupt import interrupted
from coati_relay.observe.run_result import CallbackError, RunFailed, RunResult

log = logging.getLogger(__name__)

# Environment every engine actor gets: offline hub, in-process vLLM engine, small CPU KV cache.
ACTOR_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
}


def launch_distributed(**kwargs: Any) -> RunResult:
    cfg = build_run_config(**kwargs)
    return run(cfg)


launch_distributed.__doc__ = keywords_doc(
    """Runs producers and consumers to the end and returns a `RunResult` (metrics history, checkpoints, summary).

    Takes ColossalChat's keywords, meaning what they mean there. Everything is checked in the driver before any
    actor starts (one `ConfigError` lists every problem), and a model given by Hugging Face Hub ID is resolved to
    its local snapshot there, once: the actors only ever receive local directories.""", keyword_names(),
    IGNORED_LAUNCH_KEYS)


def _place(cfg: RunConfig) -> Tuple[Any, List[Dict[str, Any]]]:
    """Reserves the roles' placement group (`coati_relay.cluster.placement`); returns it and the actor options of each
    bundle, producers first. Raises `PlacementError` within seconds when the cluster cannot hold a role."""
    import ray

    from coati_relay.cluster.placement import (
        actor_options,
        autoscaler_configured,
        check_satisfiable,
        reserve,
        role_requests,
    )

    r = cfg.roles
    cluster = ray.cluster_resources()
    requests = role_requests(r.num_producers, r.num_consumers, r.num_proc_per_producer, cluster, r.role_resources)
    check_plugin_placement(requests, cfg.plugin.name, cfg.plugin.allow_cpu_fallback)
    check_satisfiable(requests, ray.nodes(), r.placement_strategy, autoscaler_configured())
    pg = reserve(requests, r.placement_strategy, r.placement_timeout_s)
    threads = max(1, int(float(cluster.get("CPU", 1)) // len(requests)))
    env = {**ACTOR_ENV, "OMP_NUM_THREADS": str(threads)}
    return pg, [actor_options(pg, i, req, cpu_env=env) for i, req in enumerate(requests)]


def check_plugin_placement(requests: Sequence[Any], plugin: str, allow_cpu_fallback: bool) -> None:
    """Raises `PlacementError` when the consumers (``requests``: the roles' `RoleRequest`) are placed without a GPU
    (fewer GPUs than roles) but ``plugin`` needs CUDA and may not fall back to ``ddp``: said here, before any actor
    starts, not by each consumer."""
    from coati_relay.cluster.placement import PlacementError
    from coati_relay.training.plugins import PLUGINS

    consumers = [r for r in requests if r.role.startswith("consumer")]
    if allow_cpu_fallback or not PLUGINS[plugin].needs_cuda or all(r.resources.get("GPU") for r in consumers):
        return
    raise PlacementError(f"plugin {plugin!r} needs CUDA, but the cluster has too few GPUs for one per role, so "
                         f"every role runs on CPU; add GPUs, run fewer roles (num_producers, num_consumer_procs), "
                         f"or set plugin_config['allow_cpu_fallback']=True to train with 'ddp' on CPU")


def queue_bounds(cfg: RunConfig) -> Dict[str, Any]:
    """The rollout queue's bounds. Lock-step and ``n_behind``: ``n_behind + 1`` rounds of entries, staleness
    ``n_behind``. Zero-bubble: no bound in entries; producers claim tasks while fewer than ``buffer_prompts``
    prompts are claimed or queued (each task ``inference_microbatch_size`` prompts); staleness ``n_behind``
    (None: none)."""
    r = cfg.roles
    if cfg.zero_bubble:
        return {"maxsize": 0, "staleness": r.n_behind, "buffer_prompts": r.buffer_prompts,
                "task_prompts": cfg.batches.inference_microbatch_size}
    return {"maxsize": cfg.tasks_per_round * (r.n_behind + 1), "staleness": r.n_behind}


def _start_state(cfg: RunConfig) -> Dict[str, Any]:
    if not cfg.checkpointing.resume_from:
        return {"round": 0}
    from coati_relay.checkpoint import load_checkpoint

    state = load_checkpoint(cfg.checkpointing.resume_from, {})
    if int(state.get("round", 0)) >= cfg.total_rounds:
        raise ConfigError(f"resume_from={cfg.checkpointing.resume_from!r} is at round {state.get('round')}, the run "
                         f"has only {cfg.total_rounds}; raise num_episodes to train further")
    return state


def run(cfg: RunConfig) -> RunResult:
    from coati_relay.callbacks import Hooks

    hooks = Hooks(cfg.callbacks)
    try:
        result = _drive(cfg, hooks)
    except KeyboardInterrupt:  # a signal: where the run stopped, read from its files
        raise interrupted(cfg.checkpointing.run_dir, cfg.checkpointing.save_dir) from None
    result.export_dir = export_final(cfg, result)
    if cfg.progress:
        print(result.report(), file=sys.stderr, flush=True)
    hooks.run_end(result)
    return result


def _drive(cfg: RunConfig, hooks) -> RunResult:
    """The driver of both placements: starts the roles (`ActorRoles`, or `coati_relay.roles.colocated.ColocatedRoles`
    with ``colocate``), records each round and evaluation they report and gives the roles the hooks' verdict, stops
    them whatever the way out, records the checkpoint a stop saved and returns the run's `RunResult`. Raises
    `KeyboardInterrupt` where a signal stopped the run."""
    from coati_relay.observe.evaluation import EVAL_KIND, EvalAggregator
    from coati_relay.observe.recorder import RunRecorder

    t_start = time.perf_counter()
    start = _start_state(cfg)
    hooks.run_start(cfg)
    if cfg.roles.colocate:
        from coati_relay.roles.colocated import ColocatedRoles

        roles = ColocatedRoles(cfg, start, queue_bounds(cfg))
    else:
        roles = ActorRoles(cfg, start, hooks)
    recorder = None
    try:
        roles.start()
        setup_s = time.perf_counter() - t_start
        recorder = RunRecorder(cfg, start, hooks)
        evals = EvalAggregator(cfg.roles.num_producers)  # the producers' evaluation reports, summed per step

        def on_report(rec: Dict[str, Any]) -> None:
            if rec.get("kind") == EVAL_KIND:
                done = evals.add(rec)
                if done is not None:
                    recorder.evaluated(*done)
                return
            roles.verdict(int(rec["step"]), recorder.round_end(rec))

        roles.train(on_report)
        for done in evals.flush():
            recorder.evaluated(*done)
        train_s = time.perf_counter() - t_start - setup_s
    except KeyboardInterrupt:
        roles.interrupted()
        raise
    finally:
        if recorder is not None:
            recorder.close()
        roles.close()
    checkpoints = recorder.checkpoints
    stopped = roles.stop_checkpoint()
    if stopped is not None and stopped[1] not in checkpoints:
        checkpoints.append(stopped[1])
        hooks.checkpoint(*stopped)
    if roles.signalled():
        raise KeyboardInterrupt
    # train_s: training only; the log's timestamps are when the driver saw each step
    return recorder.result(setup_s, train_s, checkpoints=checkpoints,
                           **roles.result_fields(len(recorder.history), setup_s, train_s))


def export_final(cfg: RunConfig, result: RunResult) -> Optional[Path]:
    """Exports the run's last checkpoint to ``cfg.checkpointing.export_dir`` (replacing an earlier export there) and
    returns that directory; None where the run exports nothing. Every run saves at its end (the last episode's last
    round, or the step a callback stopped at), so the last checkpoint holds the final policy."""
    out = cfg.checkpointing.export_dir
    if out is None:
        return None
    if not result.checkpoints or not Path(result.checkpoints[-1]).is_dir():
        log.warning("no checkpoint on this machine to export to %s (the run saved %s); export it where it was saved "
                    "with `coati-relay export`", out, result.checkpoints[-1] if result.checkpoints else "none")
        return None
    import shutil

    from coati_relay.export import export_checkpoint

    if out.is_dir():  # an earlier export (the config's check): the new one replaces it
        shutil.rmtree(out)
    return export_checkpoint(result.checkpoints[-1], out)


class ActorRoles:
    """The roles of a disaggregated run for the driver (`run`): the queue, the weight store, the consumers and the
    producers as Ray actors in the run's placement group, supervised (`_Supervisor`). The roles run their own loops;
    `train` waits for them, passing the reports the queue collects on. The same methods as
    `coati_relay.roles.colocated.ColocatedRoles`."""

    def __init__(self, cfg: RunConfig, start: Dict[str, Any], hooks) -> None:
        self.cfg, self.hooks = cfg, hooks
        self.start_round = int(start.get("round", 0))
        self.pg = None
        self.started: List[Any] = []  # every actor of this run; all are killed on the way out, whatever the way
        self.shared_weights: Optional[str] = None  # the file full weights travel through (one host only)
        self.results: Dict[Any, Any] = {}

    def start(self) -> None:
        """Starts Ray where it is not running, reserves the placement group, starts the actors and sets them up."""
        # importing ray and ray.init set RAY_CLIENT_MODE, RAY_AUTH_MODE, PYTHONBREAKPOINT, ... in this process; the
        # processes the user starts afterwards must not inherit them
        environ = dict(os.environ)
        import ray

        from coati_relay.cluster.local_ray import start_local_ray
        from coati_relay.cluster.placement import on_head_node
        from coati_relay.exchange.queue import make_rollout_queue
        from coati_relay.exchange.shared_weights import remove_shared_weights, shared_weights_path
        from coati_relay.exchange.sync_registry import weight_sync_spec
        from coati_relay.exchange.weight_store import make_weight_store
        from coati_relay.roles.consumer import ConsumerWorker
        from coati_relay.roles.producer import ProducerWorker

        cfg, start_round, started = self.cfg, self.start_round, self.started
        actor_cfg = cfg.for_actors()  # the callbacks stay in the driver
        if not ray.is_initialized():
            start_local_ray(runtime_env={"env_vars": ACTOR_ENV})
        restore_environ(environ)
        self.pg, opts = _place(cfg)
        producer_opts, consumer_opts = opts[:cfg.roles.num_producers], opts[cfg.roles.num_producers:]
        cfg.checkpointing.run_dir.mkdir(parents=True, exist_ok=True)
        prefix = f"coati-relay/{cfg.project_name}/{uuid.uuid4().hex[:8]}"  # named, so users can find them in Ray
        service_opts = on_head_node()
        self.queue = queue = make_rollout_queue(
            **queue_bounds(cfg), total_tasks=cfg.total_rounds * cfg.tasks_per_round,
            first_task=start_round * cfg.tasks_per_round, name=f"{prefix}/rollout-queue", **service_opts)
        store = make_weight_store(name=f"{prefix}/weight-store", **service_opts)
        started += [queue, store]
        consumer_cls = ray.remote(ConsumerWorker)
        producer_cls = ray.remote(ProducerWorker)
        self.consumers = consumers = [consumer_cls.options(name=f"{prefix}/consumer-{r}", **consumer_opts[r])
                                      .remote(r, actor_cfg, queue, store) for r in range(cfg.roles.num_consumers)]
        self.producers = producers = [producer_cls.options(name=f"{prefix}/producer-{i}", **producer_opts[i])
                                      .remote(i, actor_cfg, queue, store, start_round)
                                      for i in range(cfg.roles.num_producers)]
        started += consumers + producers
        names = {**{c: f"consumer-{r}" for r, c in enumerate(consumers)},
                 **{p: f"producer-{i}" for i, p in enumerate(producers)}}
        self.supervisor = supervisor = _Supervisor(cfg, queue, names,
                                                   services={queue: "rollout queue", store: "weight store"})
        self.hooks.fail = lambda message: supervisor._fail(message, error=CallbackError)
        addr, port, weight_port = supervisor.wait_all([consumers[0].rendezvous.remote()], consumers[:1],
                                                      what="rendezvous")[0]
        if weight_sync_spec(cfg.roles.weight_sync).shared_memory:
            self.shared_weights = shared_weights_path(cfg.project_name)
        setup_refs = ([c.setup.remote(addr, port, weight_port, self.shared_weights) for c in consumers]
                      + [p.setup.remote(addr, weight_port) for p in producers])
        setups = supervisor.wait_all(setup_refs, list(names.keys()), what="set-up")
        remove_shared_weights(self.shared_weights)  # every process has it mapped: its name can go (none left if killed)
        self.nodes = {s["role"]: s["node"] for s in setups}
        self.nodes.update(zip(("rollout-queue", "weight-store"),
                              ray.get([queue.node.remote(), store.node.remote()], timeout=30)))

    def train(self, on_report) -> None:
        """Runs every role's loop (`ConsumerWorker.run`, `ProducerWorker.run`) until the consumers finish, passing
        the queue's reports to ``on_report``."""
        run_refs = {c.run.remote(): c for c in self.consumers}
        run_refs.update({p.run.remote(): p for p in self.producers})
        self.results = self.supervisor.supervise(run_refs, on_report=on_report,
                                                 stopped=lambda: self.hooks.stop_at is not None)

    def verdict(self, step: int, stop: bool) -> None:
        """The driver's word on the round that ended at ``step``, for the consumers waiting at the stop gate."""
        if self.cfg.verdict_each_round:
            import ray

            ray.get(self.queue.set_verdict.remote(step, stop), timeout=30)

    def interrupted(self) -> None:
        if self.pg is not None:
            log.warning("interrupted: stopping the run's %d actors and releasing its placement group",
                        len(self.started))

    def close(self) -> None:
        """Kills every actor of the run and releases its placement group."""
        if self.pg is None:
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        from coati_relay.exchange.shared_weights import remove_shared_weights

        for actor in self.started:
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.pg)
        remove_shared_weights(self.shared_weights)

    def stop_checkpoint(self) -> Optional[Tuple[int, str]]:
        """(step, path) of the checkpoint consumer rank 0 saved where a hook stopped the run; None otherwise."""
        path = next((self.results[c].get("checkpoint") for c in self.consumers[:1] if c in self.results), None)
        return (self.hooks.stop_at, path) if self.hooks.stop_at is not None and path else None

    def signalled(self) -> bool:
        return False  # a signal stops the actors at once (`interrupted`)

    def result_fields(self, rounds: int, setup_s: float, train_s: float) -> Dict[str, Any]:
        """The `RunResult` fields of this placement; logs an error where the consumer ranks ended apart."""
        consumer_stats = [self.results[c] for c in self.consumers if c in self.results]
        _check_ranks_agree(consumer_stats)
        return {"counters": self.supervisor.counters, "consumer_stats": consumer_stats, "nodes": self.nodes,
                "producer_stats": [self.results[p] for p in self.producers if p in self.results]}


def _check_ranks_agree(consumer_stats: List[Dict[str, Any]]) -> None:
    """Logs an error where the consumers' policies ended with different weights (data-parallel ranks that drifted
    apart: a plugin or a model whose gradients are not averaged the same way on every rank)."""
    digests = [s.get("weights_digest") for s in consumer_stats]
    if len(digests) > 1 and None not in digests and any(d != digests[0] for d in digests):
        log.error("the consumer ranks ended with different policy weights (sum, absolute sum per rank: %s); the "
                  "checkpoint holds rank 0's", digests)


class _Supervisor:
    """Waits on actor calls with timeouts, and turns a dead actor into a `RunFailed` that names it.

    Besides the roles' calls it probes the service actors (the queue, the weight store) through their pending
    ``watch`` calls (`coati_relay.cluster.liveness.LivenessProbe`): Ray fails such a call when its actor dies, so a dead
    service is named as the cause, not the role that tripped over it. ``counters`` holds the queue's counters as of
    the last poll (every second).
    """

    def __init__(self, cfg: RunConfig, queue, names: Dict[Any, str], services: Dict[Any, str]):
        from coati_relay.cluster.liveness import LivenessProbe

        self.cfg = cfg
        self.queue = queue
        self.names = names
        self.services = LivenessProbe({name: actor for actor, name in services.items()}, method="watch")
        self.counters: Dict[str, Any] = {}
        self.seen = 0

    def _dead_service(self, timeout_s: float = 0.0) -> Optional[str]:
        """'the weight store actor died (...)' when a service actor is gone, else None."""
        dead = sorted(self.services.dead(timeout_s))
        return f"the {dead[0]} actor died ({_short(self.services.causes[dead[0]], 300)})" if dead else None

    def _fail(self, message: str, dead: Optional[str] = None, error: type = RunFailed) -> None:
        import ray

        dead = dead or self._dead_service(timeout_s=1.0)
        if dead and not message.startswith(dead):
            message = f"{dead}; first seen as: {message}"
        try:
            ray.get(self.queue.close.remote(message), timeout=10)
            self.counters = ray.get(self.queue.counters.remote(), timeout=10)
        except Exception:  # the queue itself may be gone: keep the last counters it gave
            message += " (queue counters as of its last answer)"
        raise error(f"{message}; queue counters: {self.counters}", dict(self.counters))

    def _poll(self, on_report) -> bool:
        """Reads the new step reports and the counters; True when there were reports."""
        import ray

        try:
            reports, self.counters = ray.get(self.queue.progress.remote(self.seen), timeout=30)
        except ray.exceptions.GetTimeoutError:
            self._fail("the rollout queue actor did not answer within 30s")
        except ray.exceptions.RayActorError as exc:
            self._fail(self._dead_service(timeout_s=1.0) or f"the rollout queue actor died ({_short(exc, 300)})")
        for rec in reports:
            on_report(rec)
        self.seen += len(reports)
        return bool(reports)

    def _wait_one(self, pending: Dict[Any, Any], timeout_s: float) -> Optional[Any]:
        """The first finished call of ``pending`` within ``timeout_s`` (None if none); fails on a dead service."""
        import ray

        ready, _ = ray.wait(list(pending) + self.services.pending(), num_returns=1, timeout=timeout_s)
        if ready and ready[0] not in pending:  # a service's watch call ended
            dead = self._dead_service()
            if dead:
                self._fail(dead)
            return None  # only briefly unreachable: watched again
        return ready[0] if ready else None

    def wait_all(self, refs: List[Any], actors: List[Any], what: str) -> List[Any]:
        import ray

        deadline = time.monotonic() + self.cfg.roles.timeout_s + 600  # engine start and model loading included
        pending = {r: a for r, a in zip(refs, actors)}
        out = []
        while pending:
            ref = self._wait_one(pending, timeout_s=min(5.0, max(0.1, deadline - time.monotonic())))
            if ref is None:
                if time.monotonic() > deadline:
                    self._fail(f"{what} did not finish in time: waiting for "
                               f"{sorted(self.names[a] for a in pending.values())}")
                continue
            actor = pending.pop(ref)
            try:
                out.append(ray.get(ref))
            except Exception as exc:
                self._fail(f"{self.names[actor]} failed during {what}: {_short(exc)}")
        return out

    def supervise(self, run_refs: Dict[Any, Any], on_report, stopped=lambda: False) -> Dict[Any, Any]:
        """Waits for every role's run; once ``stopped()`` (a callback stopped the run), for the consumers only."""
        import ray

        results: Dict[Any, Any] = {}
        pending = dict(run_refs)
        alive_producers = sum(1 for a in pending.values() if self.names[a].startswith("producer"))
        last_progress = time.monotonic()
        while pending:
            if stopped() and not any(self.names[a].startswith("consumer") for a in pending.values()):
                break  # the producers are stopped with the other actors
            ref = self._wait_one(pending, timeout_s=1.0)
            if self._poll(on_report):
                last_progress = time.monotonic()
            if ref is None:
                if time.monotonic() - last_progress > self.cfg.roles.timeout_s + 60:
                    self._fail(f"no training step finished for {self.cfg.roles.timeout_s + 60:.0f}s; "
                               f"still running: {sorted(self.names[a] for a in pending.values())}")
                continue
            actor = pending.pop(ref)
            name = self.names[actor]
            try:
                results[actor] = ray.get(ref)
            except Exception as exc:
                failover = (name.startswith("producer") and self.cfg.roles.on_producer_failure == "continue"
                            and alive_producers > 1)
                dead = self._dead_service(timeout_s=1.0) if failover else None
                if failover and not dead:
                    alive_producers -= 1
                    lost = ray.get(self.queue.producer_died.remote(name), timeout=30)
                    log.warning("%s died (%s); its tasks %s go to the other producers", name, _short(exc), lost)
                    continue
                self._fail(f"{name} died: {_short(exc)}", dead)
        self._poll(on_report)  # reports posted after the last poll, and the final counters
        return results


def _short(exc: BaseException, limit: int = 600) -> str:
    """``Type: message (notes)`` of the exception an actor raised (Ray's wrapper, with its remote traceback, is
    unwrapped: the traceback is in the actor's log), cut to ``limit`` characters."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    notes = "; ".join(str(n) for n in getattr(exc, "__notes__", ()))
    text = f"{type(exc).__name__}: {exc}" + (f" ({notes})" if notes else "")
    return text if len(text) <= limit else text[:limit] + " ..."
