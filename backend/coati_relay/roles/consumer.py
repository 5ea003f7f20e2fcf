"""The consumer role: take a round of rollouts from the queue, train on it, publish the next weight version.

Several consumers form one data-parallel group (gloo on CPU): each takes its share of a round's queue entries,
gradients are averaged by the Booster's plugin, every rank gathers the weights and rank 0 publishes them, and all
ranks write checkpoints together (rank 0 writes the files). Models and batches live on the training device
(`coati_relay.cluster.devices`): a batch is moved there once, on entering `train_round`.

The algorithm (advantages, losses, optimizer steps) is the learner's (`coati_relay.roles.learner.Learner`); the
consumer moves data and weights around it and keeps the checkpoint cadence.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

from torch import nn

from coati_relay import algorithms as algos
from coati_relay.checkpoint import save_due
from coati_relay.cluster.heap import trim_heap
from coati_relay.cluster.placement import node_id
from coati_relay.cluster.waiting import call
from coati_relay.config.schema import RunConfig
from coati_relay.exchange.publishing import WeightPublisher
from coati_relay.exchange.queue import unpack_payloads
from coati_relay.exchange.sync_registry import weight_sync_spec
from coati_relay.observe.metrics import round_numbers
from coati_relay.observe.profiling import PhaseProfiler
from coati_relay.roles.learner import Learner
from coati_relay.roles.seeding import seed_everything
from coati_relay.rollout import Rollout
from coati_relay.training.rank_phases import set_collective_timeout

log = logging.getLogger(__name__)

DIGEST_SLICE = 1 << 22  # values per float64 slice of `ConsumerWorker.weights_digest` (32 MiB)


class ConsumerWorker:
    """One data-parallel rank, run as a Ray actor: it reads the queue and reports metrics through Ray. In a
    colocated run (`coati_relay.roles.colocated.ColocatedRoles`) it is the one rank, in the driver's process, set up
    by `setup_colocated`; its queue is an in-process handle (`coati_relay.exchange.in_process.InProcessQueue`)."""

    def __init__(self, rank: int, cfg: RunConfig, queue, weight_store):
        self.rank = rank
        self.world_size = cfg.roles.num_consumers
        self.cfg = cfg
        self.queue = queue
        self.store = weight_store
        self.publisher: Optional[WeightPublisher] = None  # rank 0's, made in setup
        self.round = 0
        self.tokenizer = None  # loaded in `_load` (none around given models: `for_models`)
        self._hosted: Dict[str, Any] = {}  # rank 0: the rendezvous stores it hosts, from `rendezvous` to `setup`
        self.profiler = PhaseProfiler(None, f"consumer-{rank}", False)

    def _start_profiling(self) -> None:
        """``enable_profiling``: phase timings per round; rank 0 also a torch profiler trace (`observe.profiling`)."""
        if self.cfg.enable_profiling:
            self.profiler = PhaseProfiler(self.cfg.checkpointing.run_dir, f"consumer-{self.rank}", True,
                                          trace=self.rank == 0)

    # -- set-up ----------------------------------------------------------------------------------------------
    def rendezvous(self) -> tuple:
        """Rank 0: hosts the stores of the data-parallel group (on ``master_port``, ColossalChat's, or a free port
        after a warning when it is taken) and of the collective weight group (when the run syncs weights that way)
        on ports that are bound from now on; returns (this node's address, the group's port, the weight group's
        port or 0). The address is this node's IP, as ColossalChat's launcher gives its consumers."""
        import ray

        from coati_relay.training.rendezvous import host_store, host_store_on

        timeout_s = self.cfg.roles.timeout_s
        self._hosted["group"] = host_store_on(self.cfg.master_port, self.world_size, timeout_s)
        if weight_sync_spec(self.cfg.roles.weight_sync).needs_port:
            self._hosted["weights"] = host_store(self.cfg.roles.num_producers + 1, timeout_s)
        ports = [self._hosted[k].port if k in self._hosted else 0 for k in ("group", "weights")]
        return (ray.util.get_node_ip_address(), *ports)

    def setup(self, master_addr: str, master_port: int, weight_port: int = 0,
              shared_weights: Optional[str] = None) -> Dict[str, Any]:
        """Joins the stores rank 0's `rendezvous` hosts (its address and ports), loads the models and publishes the
        first version (rank 0). ``shared_weights``: the shared-memory file rank 0 publishes full weights through
        (`coati_relay.exchange.shared_weights`; None: Ray's object store)."""
        from coati_relay.training.distributed import init_process_group
        from coati_relay.training.rendezvous import join_store

        cfg = self.cfg
        t0 = time.perf_counter()
        seed_everything(cfg.seed)
        self._start_profiling()
        if self.rank == 0 and "group" not in self._hosted:
            raise RuntimeError("ConsumerWorker.setup: rank 0 hosts the group's stores; call its rendezvous() first")
        store = self._hosted.pop("group", None)
        if store is None:
            store = join_store(master_addr, master_port, self.world_size, cfg.roles.timeout_s)
        init_process_group(self.rank, self.world_size, master_addr, master_port, timeout_s=cfg.roles.timeout_s,
                           store=store)
        self._load()
        if self.rank == 0:
            self.publisher = weight_sync_spec(cfg.roles.weight_sync).publisher(
                self.store, tcp_store=self._hosted.pop("weights", None), shared_path=shared_weights,
                members=cfg.roles.num_producers + 1, timeout_s=cfg.roles.timeout_s)
        self._publish(self.round)
        # from here on the ranks meet at each round's gate (timeout_s) and a step's collectives are a fault's wait
        set_collective_timeout(cfg.roles.collective_timeout_s)
        return {"role": f"consumer-{self.rank}", "node": node_id(), "setup_s": time.perf_counter() - t0,
                "start_round": self.round}

    def setup_colocated(self) -> nn.Module:
        """Set-up in a colocated run (one rank in the driver's process; the caller sets the publisher): returns the
        policy module being trained, for the producer to generate with in place."""
        seed_everything(self.cfg.seed)
        self._start_profiling()
        self._load()
        return self.policy.unwrapped()

    def _load(self) -> None:
        """The tokenizer, the models (policy, critic and reference as the algorithm needs) and the round to start
        at (that of ``resume_from``'s checkpoint, else 0)."""
        from transformers import AutoTokenizer

        from coati_relay.checkpoint import load_checkpoint
        from coati_relay.training.booster_backend import load_causal_lm

        cfg = self.cfg
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.models.tokenizer_path, **cfg.models.tokenizer_kwargs)
        spec = algos.spec(cfg.algo.algo)
        policy = load_causal_lm(cfg.models.train_path, lora=cfg.models.lora,
                                gradient_checkpointing=cfg.models.gradient_checkpointing,
                                **cfg.models.train_model_kwargs)
        critic = reference = None
        if spec.needs_critic:
            from coati_relay.training.critic import CriticModel

            critic = CriticModel.from_pretrained(cfg.models.critic_model_path)
        if getattr(cfg.algo, spec.kl_weight_key) > 0:
            reference = load_causal_lm(cfg.models.train_path, **cfg.models.train_model_kwargs)
        self._build(policy, reference, critic)
        state = {"round": 0}
        if cfg.checkpointing.resume_from:
            state = load_checkpoint(cfg.checkpointing.resume_from, self.backends)
        self.round = int(state.get("round", 0))

    @classmethod
    def for_models(cls, cfg: RunConfig, policy: nn.Module, reference: Optional[nn.Module] = None,
                   critic: Optional[nn.Module] = None, rank: int = 0) -> "ConsumerWorker":
        """A consumer around given models, without Ray, queue or publisher: `train_round` works (tests, notebooks).

        With ``cfg.roles.num_consumers > 1`` the process group must exist (`training.distributed.init_process_group`).
        ``reference``: needed when the algorithm's KL weight is > 0; ``critic``: when it trains a critic; each a
        module taking ``(input_ids, attention_mask)`` like `CriticModel`.
        """
        import torch.distributed as dist

        if cfg.roles.num_consumers > 1 and not (dist.is_initialized() and dist.get_world_size() ==
                                                cfg.roles.num_consumers):
            raise RuntimeError(f"ConsumerWorker.for_models: the config has {cfg.roles.num_consumers} consumers; join "
                               f"a process group of that size first (training.distributed.init_process_group)")
        worker = cls(rank, cfg, queue=None, weight_store=None)
        worker._build(policy, reference, critic)
        return worker

    def _build(self, policy: nn.Module, reference: Optional[nn.Module], critic: Optional[nn.Module]) -> None:
        """The learner (`coati_relay.roles.learner.Learner`) on the models; the consumer keeps its backends, which
        it publishes from and checkpoints."""
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else 0
        self.learner = Learner(self.cfg, self.rank, policy, reference, critic, pad_token_id=pad or 0)
        self.policy, self.critic, self.backends = self.learner.policy, self.learner.critic, self.learner.backends
        self.device = self.learner.device

    def train_round(self, batch: Rollout) -> Dict[str, float]:
        """The learner's `Learner.train_round` on this rank's share of the current round, once every rank has
        received its share (the round's gate: `training.rank_phases.RankPhases.gate`)."""
        self.learner.phases.gate(self.round)
        return self.learner.train_round(batch, self.round)

    def _publish(self, version: int) -> Dict[str, float]:
        """Every rank takes part in gathering the weights (a collective under gemini); rank 0 publishes them."""
        publishing = self.publisher is not None
        if self.cfg.models.lora:
            from coati_relay.exchange.lora_deltas import lora_adapters

            return self.publisher.publish(version, adapters=lora_adapters(self.policy.unwrapped())) \
                if publishing else {}
        # A publisher sending from the GPU (NCCL) takes the weights where they are: no copy to the host and back.
        # Every publisher copies what it sends before it returns, so the live tensors are handed over uncopied.
        device = self.publisher.device if publishing else None
        tensors = self.policy.state_dict_for_inference(keep=publishing, device=device, copy=False)
        return self.publisher.publish(version, tensors=tensors) if publishing else {}

    # -- the loop --------------------------------------------------------------------------------------------
    def _take(self, n: int, r: int) -> Tuple[List[Any], List[Rollout]]:
        """``n`` queue entries for round ``r`` and their rollouts. A rollout whose object died with its producer
        (the producer's node was lost after the entry left the queue) is reported to the queue, which puts its task
        back on the board, and another entry replaces it. Zero-bubble: the entries are taken one by one."""
        timeout = self.cfg.roles.timeout_s
        entries: List[Any] = []
        rollouts: List[Rollout] = []
        while len(entries) < n:
            # zero-bubble: one entry at a time, so that each frees its prompts in the data buffer as it arrives
            want = 1 if self.cfg.zero_bubble else n - len(entries)
            got = call(self.queue.get, want, timeout, r, timeout_s=timeout + 30)
            fetched = unpack_payloads([e.payload for e in got], timeout)
            lost = [e for e, x in zip(got, fetched) if x is None]
            if lost:
                log.warning("consumer-%d: %d rollout(s) of %s died with their producer; their tasks go back on "
                            "the board", self.rank, len(lost), sorted({e.producer for e in lost}))
            call(self.queue.entries_taken, [e.task for e, x in zip(got, fetched) if x is not None],
                 [e.task for e in lost], timeout_s=30)
            entries += [e for e, x in zip(got, fetched) if x is not None]
            rollouts += [x for x in fetched if x is not None]
        return entries, rollouts

    def run(self) -> Dict[str, int]:
        """Trains every remaining round; returns ``{"rounds": rounds trained, "last_round": the round reached,
        "weights_digest": `weights_digest`}``, with ``"checkpoint"`` where the driver's verdict stopped the run.

        Rank 0 posts each round's metrics to the queue's report log, where the driver collects the run's history;
        no rank keeps them (a run of any length holds no per-round record here)."""
        first = self.round
        while self.round < self.cfg.total_rounds:
            t0 = time.perf_counter()
            with self.profiler.phase("receive", self.round):
                entries, rollouts = self._take(self.cfg.entries_per_consumer, self.round)
            metrics = self.finish_round(rollouts, [e.meta for e in entries], [e.version for e in entries], t0,
                                        wait_s=time.perf_counter() - t0)
            if self.rank == 0:
                call(self.queue.report, metrics, timeout_s=30)
            if self.cfg.verdict_each_round and self.round < self.cfg.total_rounds:  # a hook or signal may stop it
                timeout = self.cfg.roles.timeout_s
                if call(self.queue.verdict, self.round, timeout, timeout_s=timeout + 30):
                    return {"rounds": self.round - first, "last_round": self.round,
                            "checkpoint": metrics.get("checkpoint") or self.save(self.round)}
            if self.round % 20 == 0:  # what the rounds freed leaves the RSS (coati_relay.cluster.heap)
                trim_heap()
        self.profiler.close()
        return {"rounds": self.round - first, "last_round": self.round, "weights_digest": self.weights_digest()}

    def weights_digest(self) -> Optional[Tuple[float, float]]:
        """(sum, absolute sum) of the policy's weights in float64, which every data-parallel rank holds the same
        (bit for bit, the same sums); None where the plugin shards the weights over the ranks (Gemini). Read in
        slices of ``DIGEST_SLICE`` values: a whole tensor in float64 (and its absolute value) would cost four times
        its float32 bytes at once (2.2 GB for a 152k x 896 embedding, the peak of a 494M run's end)."""
        if self.policy.shards_parameters:
            return None
        import torch

        total = absolute = 0.0
        with torch.no_grad():
            for p in self.policy.unwrapped().parameters():
                for part in p.detach().reshape(-1).split(DIGEST_SLICE):
                    p64 = part.double()
                    total, absolute = total + float(p64.sum()), absolute + float(p64.abs().sum())
        return total, absolute

    def finish_round(self, rollouts: List[Rollout], metas: List[Dict[str, float]], versions: List[int], t0: float,
                     wait_s: float) -> Dict[str, Any]:
        """Trains the current round on ``rollouts`` (their producers' ``metas`` and weight ``versions``), publishes
        the next weight version, checkpoints when due; returns the round's metrics. ``t0``: when the round began
        (`time.perf_counter`); ``wait_s``: how long getting the rollouts took."""
        cfg = self.cfg
        batch = Rollout.concat(rollouts, self.tokenizer.pad_token_id)
        t1, started_at = time.perf_counter(), time.time()
        with self.profiler.phase("step", self.round):
            metrics = self.train_round(batch)
        train_s = time.perf_counter() - t1
        self.round += 1
        with self.profiler.phase("sync_model", self.round - 1), \
                self.learner.phases.phase("weight publish", self.round - 1):
            metrics.update(self._publish(self.round))  # every rank gathers, rank 0 publishes
        load_s = max((m.get("weight_load_last_s", 0.0) for m in metas), default=0.0)
        metrics.update({
            "step": self.round, "version": self.round, "rollout_version_min": min(versions),
            "wait_s": wait_s, "train_s": train_s,
            "train_started_at": started_at, "train_ended_at": started_at + train_s,
            "samples": batch.num_sequences * self.world_size,
            "generate_s": sum(m.get("generate_s", 0.0) for m in metas),
            "weight_sync_s": metrics.get("weight_publish_s", 0.0) + load_s,
        })
        if save_due(self.round, cfg.rounds_per_episode, cfg.checkpointing.save_interval):
            with self.profiler.phase("save", self.round - 1), self.learner.phases.phase("checkpoint", self.round - 1):
                metrics["checkpoint"] = self.save(self.round, record=metrics)
        self.profiler.round_finished()
        elapsed = max(time.perf_counter() - t0, 1e-9)
        metrics.update(round_s=elapsed, samples_per_s=metrics["samples"] / elapsed)
        return metrics

    def save(self, step: int, record: Optional[Dict[str, Any]] = None) -> str:
        """Writes the checkpoint of ``step`` (every rank takes part; rank 0 writes the files); returns its path.

        ``record``: the metrics of the round that ended at ``step``, when the driver has not logged them yet; the
        checkpoint keeps their numbers (`coati_relay.observe.metrics.round_numbers`), so a run killed before the
        driver logs them logs them on resuming (`coati_relay.observe.recorder.RunRecorder`)."""
        from coati_relay.checkpoint import save_checkpoint

        state: Dict[str, Any] = {"round": step, "version": step}
        if record is not None:
            state["record"] = round_numbers(record)
        return str(save_checkpoint(self.cfg.checkpointing.save_dir, step, self.backends, state))

