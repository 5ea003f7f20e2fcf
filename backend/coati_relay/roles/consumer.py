"""The consumer role: take a round of rollouts from the queue, train on it, publish the next weight version.

Several consumers form one data-parallel group (gloo on CPU): each takes its share of a round's queue entries,
gradients are averaged by the Booster's plugin, every rank gathers the weights and rank 0 publishes them, and all
ranks write checkpoints together (rank 0 writes the files). Models and batches live on the training device
(`coati_relay.cluster.devices`): a batch is moved there once, on entering `train_round`.

Per round (``P`` prompts on this rank, ``G`` responses each, ``N = P*G`` sequences, ``R`` response tokens): the
advantages come from the estimator registered under ``grpo_config['algo']`` (else ``core_algo``;
`coati_relay.algorithms.estimators`), fed the
rewards [N], the reference model's log-probs [N, R] when its KL weight is > 0, and a critic's values [N, R] when
the estimator's spec asks for one (PPO; the critic then learns with the clipped value loss). The policy loss carries
``beta * KL`` unless the estimator put the KL into rewards or advantages itself.
Behaviour log-probs: the producer's, which are those of the tempered distribution; with ``top_k``/``top_p`` they
are of the truncated distribution instead, so the policy recomputes them over the full one before the round's
first update (one forward without gradient), as the legacy experience maker did.
Optimizer steps: ``train_batch_size`` prompts each; their gradients accumulate over forward chunks of
``min(train_microbatch_size, train_minibatch_size * G)`` sequences (there is no separate mini-batch level). The loss
of a step is normalised by the kept samples (sample_level) or kept tokens (token_level) of the whole step over all
ranks, so N ranks compute the gradient that one rank holding the whole batch would.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from coati_relay import algorithms as algos
from coati_relay.checkpoint import save_due
from coati_relay.cluster.devices import to_device
from coati_relay.cluster.heap import trim_heap
from coati_relay.cluster.placement import node_id
from coati_relay.config.schema import RunConfig
from coati_relay.observe.profiling import PhaseProfiler
from coati_relay.roles.learner import StepRows, micro_batch_rows, optimizer_step
from coati_relay.roles.logprobs import response_logprobs
from coati_relay.roles.seeding import seed_everything
from coati_relay.rollout import Rollout
from coati_relay.training.distributed import all_reduce_sum
from coati_relay.training.plugins import plugin_for_plain_module, precision_dtype, with_accumulation
from coati_relay.training.schedule import COLOSSALCHAT_MIN_LR_RATIO, colossalchat_cosine_rounds

log = logging.getLogger(__name__)


def fetch_or_none(refs: List[Any], timeout_s: float) -> List[Any]:
    """The objects of ``refs``, with None for each one lost with its owner (``ObjectLostError``)."""
    import ray
    from ray.exceptions import ObjectLostError

    try:
        return ray.get(list(refs), timeout=timeout_s)
    except ObjectLostError:
        out = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=timeout_s))
            except ObjectLostError:
                out.append(None)
        return out


class ConsumerWorker:
    """One data-parallel rank, run as a Ray actor: it reads the queue and reports metrics through Ray. In a
    colocated run (`coati_relay.roles.colocated`) the driver calls `setup_colocated` and `finish_round` instead."""

    def __init__(self, rank: int, cfg: RunConfig, queue, weight_store):
        self.rank = rank
        self.world_size = cfg.roles.num_consumers
        self.cfg = cfg
        self.queue = queue
        self.store = weight_store
        self.publisher = None  # rank 0's, made in setup
        self.round = 0
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
        if self.cfg.roles.weight_sync == "collective":
            self._hosted["weights"] = host_store(self.cfg.roles.num_producers + 1, timeout_s)
        ports = [self._hosted[k].port if k in self._hosted else 0 for k in ("group", "weights")]
        return (ray.util.get_node_ip_address(), *ports)

    def setup(self, master_addr: str, master_port: int, weight_port: int = 0) -> Dict[str, Any]:
        """Joins the stores rank 0's `rendezvous` hosts (its address and ports), loads the models and publishes the
        first version (rank 0)."""
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
            if cfg.roles.weight_sync == "collective":
                from coati_relay.exchange.weight_sync_collective import CollectivePublisher

                self.publisher = CollectivePublisher(self.store, self._hosted.pop("weights"),
                                                     cfg.roles.num_producers + 1, cfg.roles.timeout_s)
            else:
                from coati_relay.exchange.weight_sync import WeightPublisher

                self.publisher = WeightPublisher(self.store)
        self._publish(self.round)
        return {"role": f"consumer-{self.rank}", "node": node_id(), "setup_s": time.perf_counter() - t0,
                "start_round": self.round}

    def setup_colocated(self) -> nn.Module:
        """Set-up in a colocated run (one rank in the driver's process, no publisher): returns the policy module
        being trained, for the producer to generate with in place."""
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
        """The training backends and the reference model, all on the training device (`coati_relay.cluster.devices`)."""
        from coati_relay.training.booster_backend import TrainingBackend

        cfg, a = self.cfg, self.cfg.algo
        self.spec = algos.spec(a.algo)
        self.estimator = algos.get("advantage", a.algo)
        kl_weight = getattr(a, self.spec.kl_weight_key)
        if (kl_weight > 0) != (reference is not None):
            raise ValueError(f"{a.algo} with {self.spec.kl_weight_key}={kl_weight} needs "
                             f"{'a' if kl_weight > 0 else 'no'} reference model")
        if self.spec.needs_critic != (critic is not None):
            raise ValueError(f"{a.algo} trains {'a' if self.spec.needs_critic else 'no'} critic")
        steps_per_round = cfg.optimizer_steps_per_round * a.ppo_epochs
        total_steps, min_lr_ratio = cfg.total_rounds * steps_per_round, 0.0
        if a.lr_scheduler == "colossalchat":  # ColossalChat's cosine, in rounds (`training.schedule`)
            total_steps = colossalchat_cosine_rounds(cfg.batches.num_episodes, cfg.rounds_per_episode)
            min_lr_ratio = COLOSSALCHAT_MIN_LR_RATIO
        b = cfg.batches
        micro_batches = -(-b.train_batch_size * b.num_generations // micro_batch_rows(b))
        common = dict(plugin=cfg.plugin.name,
                      plugin_options=with_accumulation(cfg.plugin.name, cfg.plugin.options, micro_batches),
                      allow_cpu_fallback=cfg.plugin.allow_cpu_fallback,
                      max_grad_norm=a.max_grad_norm, scheduler=a.lr_scheduler, total_steps=total_steps,
                      warmup_steps=a.warmup_steps, weight_decay=a.weight_decay, min_lr_ratio=min_lr_ratio,
                      steps_per_round=steps_per_round, rounds=cfg.total_rounds)
        self.policy = TrainingBackend(policy, lr=a.lr, **common)
        self.device = self.policy.device
        self.backends = {"policy": self.policy}
        self.critic = None
        if critic is not None:
            name, options = plugin_for_plain_module(cfg.plugin.name, common["plugin_options"])
            self.critic = TrainingBackend(critic, lr=a.critic_lr, **{**common, "plugin": name,
                                                                      "plugin_options": options})
            self.backends["critic"] = self.critic
        self.reference = None
        if reference is not None:  # in the policy's compute dtype: both give the same log-probs at the first step
            dtype = getattr(torch, precision_dtype(self.policy.plugin_name, cfg.plugin.options))
            self.reference = reference.to(self.device, dtype=dtype).eval().requires_grad_(False)
        s = cfg.sampling
        # A truncated sampler (top-k/top-p) reports the log-probs of the renormalised truncated distribution; the
        # losses need the full one's, so train_round recomputes them.
        self.recompute_behaviour = s.top_k > 0 or s.top_p < 1.0
        if self.recompute_behaviour and self.rank == 0:
            log.info("top_k=%d, top_p=%s: old log-probs are recomputed over the full distribution each round",
                     s.top_k, s.top_p)

    def _publish(self, version: int) -> Dict[str, float]:
        """Every rank takes part in gathering the weights (a collective under gemini); rank 0 publishes them."""
        publishing = self.publisher is not None
        if self.cfg.models.lora:
            from coati_relay.exchange.weight_sync import lora_adapters

            return self.publisher.publish(version, adapters=lora_adapters(self.policy.unwrapped())) \
                if publishing else {}
        # A publisher sending from the GPU (NCCL) takes the weights where they are: no copy to the host and back.
        tensors = self.policy.state_dict_for_inference(keep=publishing, device=getattr(self.publisher, "device", None))
        return self.publisher.publish(version, tensors=tensors) if publishing else {}

    # -- the loop --------------------------------------------------------------------------------------------
    def _take(self, n: int, r: int) -> Tuple[List[Any], List[Rollout]]:
        """``n`` queue entries for round ``r`` and their rollouts. A rollout whose object died with its producer
        (the producer's node was lost after the entry left the queue) is reported to the queue, which puts its task
        back on the board, and another entry replaces it. Zero-bubble: the entries are taken one by one."""
        import ray

        timeout = self.cfg.roles.timeout_s
        entries: List[Any] = []
        rollouts: List[Rollout] = []
        while len(entries) < n:
            # zero-bubble: one entry at a time, so that each frees its prompts in the data buffer as it arrives
            want = 1 if self.cfg.zero_bubble else n - len(entries)
            got = ray.get(self.queue.get.remote(want, timeout, r), timeout=timeout + 30)
            fetched = fetch_or_none([e.payload[0] for e in got], timeout)
            lost = [e for e, x in zip(got, fetched) if x is None]
            if lost:
                log.warning("consumer-%d: %d rollout(s) of %s died with their producer; their tasks go back on "
                            "the board", self.rank, len(lost), sorted({e.producer for e in lost}))
            ray.get(self.queue.entries_taken.remote([e.task for e, x in zip(got, fetched) if x is not None],
                                                    [e.task for e in lost]), timeout=30)
            entries += [e for e, x in zip(got, fetched) if x is not None]
            rollouts += [x for x in fetched if x is not None]
        return entries, rollouts

    def run(self) -> Dict[str, int]:
        """Trains every remaining round; returns ``{"rounds": rounds trained, "last_round": the round reached}``.

        Rank 0 posts each round's metrics to the queue's report log, where the driver collects the run's history;
        no rank keeps them (a run of any length holds no per-round record here)."""
        import ray

        first = self.round
        while self.round < self.cfg.total_rounds:
            t0 = time.perf_counter()
            with self.profiler.phase("receive", self.round):
                entries, rollouts = self._take(self.cfg.entries_per_consumer, self.round)
            metrics = self.finish_round(rollouts, [e.meta for e in entries], [e.version for e in entries], t0,
                                        wait_s=time.perf_counter() - t0)
            if self.rank == 0:
                ray.get(self.queue.report.remote(metrics), timeout=30)
            if self.cfg.stop_gate and self.round < self.cfg.total_rounds:  # a driver's hook may stop the run here
                timeout = self.cfg.roles.timeout_s
                if ray.get(self.queue.verdict.remote(self.round, timeout), timeout=timeout + 30):
                    return {"rounds": self.round - first, "last_round": self.round,
                            "checkpoint": metrics.get("checkpoint") or self.save(self.round)}
            if self.round % 20 == 0:  # what the rounds freed leaves the RSS (coati_relay.cluster.heap)
                trim_heap()
        self.profiler.close()
        return {"rounds": self.round - first, "last_round": self.round}

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
        with self.profiler.phase("sync_model", self.round - 1):
            metrics.update(self._publish(self.round))  # every rank gathers, rank 0 publishes
        if save_due(self.round, cfg.rounds_per_episode, cfg.checkpointing.save_interval):
            with self.profiler.phase("save", self.round - 1):
                metrics["checkpoint"] = self.save(self.round)
        self.profiler.round_finished()
        load_s = max((m.get("weight_load_last_s", 0.0) for m in metas), default=0.0)
        elapsed = max(time.perf_counter() - t0, 1e-9)
        metrics.update({
            "step": self.round, "version": self.round, "rollout_version_min": min(versions),
            "wait_s": wait_s, "train_s": train_s, "round_s": elapsed,
            "train_started_at": started_at, "train_ended_at": started_at + train_s,
            "samples": batch.num_sequences * self.world_size,
            "samples_per_s": batch.num_sequences * self.world_size / elapsed,
            "generate_s": sum(m.get("generate_s", 0.0) for m in metas),
            "weight_sync_s": metrics.get("weight_publish_s", 0.0) + load_s,
        })
        return metrics

    def save(self, step: int) -> str:
        """Writes the checkpoint of ``step`` (every rank takes part; rank 0 writes the files); returns its path."""
        from coati_relay.checkpoint import save_checkpoint

        return str(save_checkpoint(self.cfg.checkpointing.save_dir, step, self.backends,
                                   {"round": step, "version": step}))

    # -- training --------------------------------------------------------------------------------------------
    def train_round(self, batch: Rollout) -> Dict[str, float]:
        """Advantages, then ``ppo_epochs`` passes of optimizer steps over this rank's share of a round.

        Every rank of the data-parallel group calls it on a batch of the same number of rows (collectives: the
        counts of each step, the statistics at the end). With ``filter_range`` and ``dynamic_batching`` (ColossalChat's
        default), the groups outside the range leave the round and the kept ones fill optimizer steps of
        ``train_batch_size`` groups; the groups short of a whole step (on the rank with the fewest) wait for the next
        round, where they train beside its groups (`_dynamic_batch`).
        """
        a = self.cfg.algo
        stats: Dict[str, float] = {"reward": batch.rewards.float().mean().item(),
                                   "response_length": batch.response_lengths.float().mean().item()}
        if a.filter_range and a.dynamic_batching:
            batch = self._dynamic_batch(batch, stats)
            if not batch.num_sequences:  # the same on every rank: no step this round, the weights stay
                return self._over_ranks({**stats, "skipped_steps": 1.0})
        num_resp = batch.response_ids.size(1)
        seq, attn, mask, behaviour, rewards, lengths = to_device(
            self.device, batch.sequences, batch.attention_mask, batch.response_mask.float(), batch.logprobs,
            batch.rewards.float(), batch.response_lengths)
        g = batch.group_size
        self._eval_mode()  # no dropout in the old log-probs and values; `_optimizer_step` restores train mode
        with torch.no_grad():
            old_logp = behaviour
            if self.recompute_behaviour:
                old_logp = self._logprobs_chunked(self.policy.model, seq, attn, num_resp)
                stats["behaviour_logp_gap"] = algos.masked_mean(behaviour - old_logp, mask).item()
            ref_logp = None
            if self.reference is not None:
                ref_logp = self._logprobs_chunked(self.reference, seq, attn, num_resp)
            values = None
            if self.critic is not None:
                values = self._values(seq, attn, batch.prompt_ids.size(1), num_resp)
            out = self.estimator(algos.AdvantageInputs(rewards, g, mask, old_logp, ref_logp, values), a)
            loss_mask = self._loss_mask(_accuracy(batch).to(self.device), lengths, g,
                                        by_range=not a.dynamic_batching)
        stats["kept_fraction"] = loss_mask.mean().item()
        rows = StepRows(seq, attn, mask, old_logp, out.advantages, loss_mask, ref_logp, values, out.returns)
        per_step = self.cfg.batches.train_batch_size * g
        step_stats = [self._optimizer_step(rows.take(slice(start, start + per_step)), num_resp)
                      for _ in range(a.ppo_epochs) for start in range(0, batch.num_sequences, per_step)]
        for key in sorted({k for st in step_stats for k in st}):
            present = [st[key] for st in step_stats if key in st]
            stats[key] = sum(present) / len(present)
        return self._over_ranks(stats)

    def _dynamic_batch(self, batch: Rollout, stats: Dict[str, float]) -> Rollout:
        """ColossalChat's dynamic batching: drops the groups whose mean answer accuracy is not strictly inside
        ``filter_range``, joins the kept ones to those left from earlier rounds and returns the first ``k *
        train_batch_size`` of them, k the whole steps the rank with the fewest can fill (every rank steps together);
        the rest wait in ``self._carry`` for the next round."""
        lo, hi = self.cfg.algo.filter_range
        g, tbs = batch.group_size, self.cfg.batches.train_batch_size
        mean = _accuracy(batch).float().view(-1, g).mean(dim=1)
        kept = ((mean > lo) & (mean < hi)).nonzero().flatten().tolist()
        stats["kept_group_fraction"] = len(kept) / max(1, batch.num_prompts)
        carry = getattr(self, "_carry", None)
        parts = ([carry] if carry is not None else []) + [batch.take_groups(kept)]
        pad = getattr(getattr(self, "tokenizer", None), "pad_token_id", None) or 0
        pool = Rollout.concat(parts, pad)
        from coati_relay.training.distributed import all_reduce_min

        ready = all_reduce_min(pool.num_prompts // tbs) * tbs
        self._carry = pool.take_groups(range(ready, pool.num_prompts)) if ready < pool.num_prompts else None
        stats["carried_groups"] = float(pool.num_prompts - ready)
        return pool.take_groups(range(ready))

    def _eval_mode(self) -> None:
        self.policy.model.eval()
        if self.critic is not None:
            self.critic.model.eval()

    def _logprobs(self, model, seq, attn, num_resp) -> torch.Tensor:
        """[N, R] log-probs of the policy (``self.policy.model``) or the reference model; the samples of a group
        share one forward of their prompt where the model allows (`coati_relay.roles.prompt_sharing`)."""
        if model is self.policy.model:
            return response_logprobs(model, seq, attn, num_resp, temperature=self.cfg.sampling.temperature,
                                     causal_lm=self.policy.causal_lm, share_prompts=self.policy.shares_prompts)
        return response_logprobs(model, seq, attn, num_resp, temperature=self.cfg.sampling.temperature,
                                 share_prompts=True)

    def _logprobs_chunked(self, model, seq, attn, num_resp) -> torch.Tensor:
        """`_logprobs` in forward chunks of the micro-batch size (no gradient): [N, R]."""
        micro = self.cfg.batches.train_microbatch_size
        return torch.cat([self._logprobs(model, seq[s:s + micro], attn[s:s + micro], num_resp)
                          for s in range(0, seq.size(0), micro)])

    def _values(self, seq, attn, prompt_len: int, num_resp: int) -> torch.Tensor:
        """Critic value of the state before each response token: positions P-1 .. P+R-2 -> [N, R]."""
        v = self.critic.model(seq, attention_mask=attn)
        return v[:, prompt_len - 1: prompt_len - 1 + num_resp].float()

    def _loss_mask(self, accuracy: torch.Tensor, lengths: torch.Tensor, group_size: int,
                   by_range: bool = True) -> torch.Tensor:
        """[N] 1.0 for sequences that train, 0.0 for those the filters drop: with ``by_range``, groups whose mean
        answer accuracy (``accuracy`` [N]: ans_acc, or the reward where the reward gives no accuracy) is not
        strictly inside ``filter_range``; with ``filter_truncated_response``, responses that reach
        ``max_new_tokens``."""
        a = self.cfg.algo
        keep = torch.ones(lengths.shape, dtype=torch.float32, device=lengths.device)
        if a.filter_range and by_range and accuracy.numel():
            lo, hi = a.filter_range
            mean = accuracy.float().view(-1, group_size).mean(dim=1, keepdim=True).expand(-1, group_size)
            keep *= ((mean > lo) & (mean < hi)).reshape(-1).float()
        if a.filter_truncated_response:
            keep *= (lengths < self.cfg.sampling.max_new_tokens).float()
        return keep

    def _optimizer_step(self, rows: StepRows, num_resp: int) -> Dict[str, float]:
        return optimizer_step(self, rows, num_resp)

    def _over_ranks(self, stats: Dict[str, float]) -> Dict[str, float]:
        """The statistics of the whole data-parallel group: losses summed (each rank holds its share of the
        batch's loss), the others averaged (every rank trains on as many rows). The keys are the same on every
        rank (they follow the configuration and the all-reduced counts)."""
        if self.world_size == 1:
            return stats
        keys = sorted(stats)
        total = all_reduce_sum(torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64,
                                            device=self.device)).tolist()
        return {k: v if k in _SUMMED_STATS else v / self.world_size for k, v in zip(keys, total)}


_SUMMED_STATS = {"loss", "value_loss"}


def _accuracy(batch: Rollout) -> torch.Tensor:
    """[N] what ``filter_range`` compares: the answer accuracy a rule reward gives (ColossalChat's ans_acc), else
    the reward (registered or callable rewards, a reward model)."""
    return (batch.ans_acc if batch.ans_acc is not None else batch.rewards).float()
