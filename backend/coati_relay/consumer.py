"""The consumer role: take a round of rollouts from the queue, train on it, publish the next weight version.

Several consumers form one data-parallel group (gloo on CPU): each takes its share of a round's queue entries,
gradients are averaged by the Booster's DDP wrapper, and rank 0 publishes the weights and writes checkpoints.

Per round (``P`` prompts on this rank, ``G`` responses each, ``N = P*G`` sequences, ``R`` response tokens): the
advantages come from the estimator registered under ``core_algo`` (`coati_relay.algorithms.estimators`), fed the
rewards [N], the reference model's log-probs [N, R] when its KL weight is > 0, and a critic's values [N, R] when
the estimator's spec asks for one (PPO; the critic then learns with the clipped value loss). The policy loss carries
``beta * KL`` unless the estimator put the KL into rewards or advantages itself.
Optimizer steps: ``train_batch_size`` prompts each; their gradients accumulate over forward chunks of
``min(train_microbatch_size, train_minibatch_size * G)`` sequences (there is no separate mini-batch level).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Tuple

import torch

from coati_relay import algorithms as algos
from coati_relay.logprobs import response_logprobs
from coati_relay.placement import node_id
from coati_relay.rollout import Rollout
from coati_relay.run_config import RunConfig

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
    """One data-parallel rank, run as a Ray actor: it reads the queue and reports metrics through Ray."""

    def __init__(self, rank: int, cfg: RunConfig, queue, weight_store):
        self.rank = rank
        self.world_size = cfg.roles.num_consumers
        self.cfg = cfg
        self.queue = queue
        self.store = weight_store
        self.round = 0

    # -- set-up ----------------------------------------------------------------------------------------------
    def rendezvous(self) -> tuple:
        """(address, port for the data-parallel group, port for the weight group) on this process's node."""
        import ray

        from coati_relay.training.distributed import free_port

        return ray.util.get_node_ip_address(), free_port(), free_port()

    def setup(self, master_addr: str, master_port: int, weight_port: int = 0) -> Dict[str, Any]:
        from transformers import AutoTokenizer

        from coati_relay.checkpoint import load_checkpoint
        from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm
        from coati_relay.training.distributed import init_process_group

        cfg, a = self.cfg, self.cfg.algo
        t0 = time.perf_counter()
        torch.manual_seed(cfg.seed)
        init_process_group(self.rank, self.world_size, master_addr, master_port)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.models.tokenizer_path)
        total_steps = cfg.total_rounds * cfg.optimizer_steps_per_round * a.ppo_epochs
        common = dict(plugin=cfg.plugin.name, plugin_options=cfg.plugin.options,
                      allow_cpu_fallback=cfg.plugin.allow_cpu_fallback,
                      max_grad_norm=a.max_grad_norm, scheduler=a.lr_scheduler, total_steps=total_steps,
                      warmup_steps=a.warmup_steps, weight_decay=a.weight_decay)
        self.policy = TrainingBackend(load_causal_lm(cfg.models.train_path, lora=cfg.models.lora), lr=a.lr, **common)
        self.backends = {"policy": self.policy}
        self.critic = None
        self.spec = algos.spec(cfg.core_algo)
        self.estimator = algos.get("advantage", cfg.core_algo)
        if self.spec.needs_critic:
            from coati_relay.training.critic import CriticModel

            self.critic = TrainingBackend(CriticModel.from_pretrained(cfg.models.critic_model_path), lr=a.critic_lr,
                                          **common)
            self.backends["critic"] = self.critic
        kl_weight = getattr(a, self.spec.kl_weight_key)
        self.reference = None
        if kl_weight > 0:
            self.reference = load_causal_lm(cfg.models.train_path).eval().requires_grad_(False)
        state = {"round": 0}
        if cfg.checkpointing.resume_from:
            state = load_checkpoint(cfg.checkpointing.resume_from, self.backends)
        self.round = int(state.get("round", 0))
        self.publisher = None
        if self.rank == 0:
            if cfg.roles.weight_sync == "collective":
                from coati_relay.weight_sync_collective import CollectivePublisher

                self.publisher = CollectivePublisher(self.store, master_addr, weight_port, cfg.roles.num_producers + 1,
                                                     cfg.roles.timeout_s)
            else:
                from coati_relay.weight_sync import WeightPublisher

                self.publisher = WeightPublisher(self.store)
            self._publish(self.round)
        return {"role": f"consumer-{self.rank}", "node": node_id(), "setup_s": time.perf_counter() - t0,
                "start_round": self.round}

    def _publish(self, version: int) -> Dict[str, float]:
        if self.cfg.models.lora:
            from coati_relay.weight_sync import lora_adapters

            return self.publisher.publish(version, adapters=lora_adapters(self.policy.unwrapped()))
        return self.publisher.publish(version, tensors=self.policy.state_dict_for_inference())

    # -- the loop --------------------------------------------------------------------------------------------
    def _take(self, n: int, r: int) -> Tuple[List[Any], List[Rollout]]:
        """``n`` queue entries for round ``r`` and their rollouts. A rollout whose object died with its producer
        (the producer's node was lost after the entry left the queue) is reported to the queue, which puts its task
        back on the board, and another entry replaces it."""
        import ray

        timeout = self.cfg.roles.timeout_s
        entries: List[Any] = []
        rollouts: List[Rollout] = []
        while len(entries) < n:
            got = ray.get(self.queue.get.remote(n - len(entries), timeout, r), timeout=timeout + 30)
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

    def run(self) -> List[Dict[str, Any]]:
        """Trains every remaining round; returns this rank's metrics history."""
        import ray

        from coati_relay.checkpoint import save_checkpoint

        cfg = self.cfg
        history = []
        while self.round < cfg.total_rounds:
            r = self.round
            t0 = time.perf_counter()
            entries, rollouts = self._take(cfg.entries_per_consumer, r)
            wait_s = time.perf_counter() - t0
            batch = Rollout.concat(rollouts, self.tokenizer.pad_token_id)
            t1 = time.perf_counter()
            metrics = self.train_round(batch)
            train_s = time.perf_counter() - t1
            self.round = r + 1
            if self.rank == 0:
                metrics.update(self._publish(self.round))
            if self.round % cfg.checkpointing.save_interval == 0 or self.round == cfg.total_rounds:
                path = save_checkpoint(cfg.checkpointing.save_dir, self.round, self.backends,  # every rank takes part
                                       {"round": self.round, "version": self.round})
                metrics["checkpoint"] = str(path)
            load_s = max((e.meta.get("weight_load_last_s", 0.0) for e in entries), default=0.0)
            metrics.update({
                "step": self.round, "version": self.round, "rollout_version_min": min(e.version for e in entries),
                "wait_s": wait_s, "train_s": train_s, "round_s": time.perf_counter() - t0,
                "samples": batch.num_sequences * self.world_size,
                "samples_per_s": batch.num_sequences * self.world_size / max(time.perf_counter() - t0, 1e-9),
                "generate_s": sum(e.meta.get("generate_s", 0.0) for e in entries),
                "weight_sync_s": metrics.get("weight_publish_s", 0.0) + load_s,
            })
            history.append(metrics)
            if self.rank == 0:
                ray.get(self.queue.report.remote(metrics), timeout=30)
        return history

    # -- training --------------------------------------------------------------------------------------------
    def train_round(self, batch: Rollout) -> Dict[str, float]:
        cfg, a = self.cfg, self.cfg.algo
        seq, attn = batch.sequences, batch.attention_mask
        mask = batch.response_mask.float()
        num_resp = batch.response_ids.size(1)
        rewards = batch.rewards.float()
        stats: Dict[str, float] = {"reward": rewards.mean().item(),
                                   "response_length": batch.response_lengths.float().mean().item()}
        with torch.no_grad():
            ref_logp = None
            if self.reference is not None:
                ref_logp = self._logprobs(self.reference, seq, attn, num_resp)
            values = None
            if self.critic is not None:
                values = self._values(seq, attn, batch.prompt_ids.size(1), num_resp)
            out = self.estimator(algos.AdvantageInputs(rewards, batch.group_size, mask, batch.logprobs, ref_logp,
                                                       values), a)
            advantages, returns = out.advantages, out.returns
            loss_mask = self._loss_mask(batch, rewards)
        stats["kept_fraction"] = loss_mask.mean().item()
        prompts_per_step = cfg.batches.train_batch_size
        g = batch.group_size
        step_stats: List[Dict[str, float]] = []
        for _ in range(a.ppo_epochs):
            for start in range(0, batch.num_prompts, prompts_per_step):
                rows = slice(start * g, (start + prompts_per_step) * g)
                step_stats.append(self._optimizer_step(
                    seq[rows], attn[rows], mask[rows], batch.logprobs[rows], advantages[rows], loss_mask[rows],
                    None if ref_logp is None else ref_logp[rows], None if values is None else values[rows],
                    None if returns is None else returns[rows], num_resp))
        for key in step_stats[0]:
            stats[key] = sum(s[key] for s in step_stats) / len(step_stats)
        return stats

    def _logprobs(self, model, seq, attn, num_resp) -> torch.Tensor:
        return response_logprobs(model, seq, attn, num_resp, temperature=self.cfg.sampling.temperature)

    def _values(self, seq, attn, prompt_len: int, num_resp: int) -> torch.Tensor:
        """Critic value of the state before each response token: positions P-1 .. P+R-2 -> [N, R]."""
        v = self.critic.model(seq, attention_mask=attn)
        return v[:, prompt_len - 1: prompt_len - 1 + num_resp].float()

    def _loss_mask(self, batch: Rollout, rewards: torch.Tensor) -> torch.Tensor:
        """[N] 1.0 for sequences that train, 0.0 for those DAPO's filters drop."""
        a = self.cfg.algo
        keep = torch.ones(batch.num_sequences)
        if a.filter_range and batch.group_size > 1:
            lo, hi = a.filter_range
            mean = rewards.view(-1, batch.group_size).mean(dim=1, keepdim=True).expand(-1, batch.group_size)
            keep *= ((mean > lo) & (mean < hi)).reshape(-1).float()
        if a.filter_truncated_response:
            keep *= (batch.response_lengths < self.cfg.sampling.max_new_tokens).float()
        return keep

    def _optimizer_step(self, seq, attn, mask, old_logp, adv, loss_mask, ref_logp, values, returns,
                        num_resp) -> Dict[str, float]:
        """One optimizer step over ``train_batch_size`` prompts, accumulated in micro-batches."""
        cfg, a = self.cfg, self.cfg.algo
        n = seq.size(0)
        b = cfg.batches
        micro = min(b.train_microbatch_size, b.train_minibatch_size * b.num_generations, n)
        token_level = a.loss_variation == "token_level"
        total_tokens = (mask * loss_mask.unsqueeze(1)).sum().clamp(min=1.0)
        sums: Dict[str, float] = {}
        self.policy.train()
        for s in range(0, n, micro):
            sl = slice(s, s + micro)
            logp = self._logprobs(self.policy.model, seq[sl], attn[sl], num_resp)
            per_token_kl = None if ref_logp is None else algos.kl_estimate(logp, ref_logp[sl], kind="k3")
            loss, st = algos.policy_loss(
                logp, old_logp[sl], adv[sl], mask[sl], clip_eps_low=a.clip_eps_low,
                clip_eps_high=a.clip_eps_high, aggregation=a.loss_variation, per_token_kl=per_token_kl,
                beta=a.beta if self.spec.kl_in_loss else 0.0, loss_mask=loss_mask[sl],
                total_tokens=total_tokens if token_level else None)
            weight = 1.0 if token_level else (seq[sl].size(0) / n)
            self.policy.backward(loss * weight)
            _add(sums, "loss", loss.item() * weight)
            _add(sums, "clip_frac", st.get("clip_frac", 0.0) * seq[sl].size(0) / n)
            if per_token_kl is not None:
                _add(sums, "kl", algos.masked_mean(per_token_kl, mask[sl]).item() * seq[sl].size(0) / n)
            if self.critic is not None:
                self.critic.train()
                v = self._values(seq[sl], attn[sl], seq.size(1) - num_resp, num_resp)
                vloss = algos.value_loss(v, values[sl], returns[sl], clip_eps=a.value_clip, mask=mask[sl])
                self.critic.backward(vloss * seq[sl].size(0) / n)
                _add(sums, "value_loss", vloss.item() * seq[sl].size(0) / n)
        out = self.policy.step()
        self.policy.zero_grad()
        sums["lr"] = float(out.get("lr", a.lr))
        if self.critic is not None:
            self.critic.step()
            self.critic.zero_grad()
        return sums


def _add(d: Dict[str, float], key: str, value: float) -> None:
    d[key] = d.get(key, 0.0) + value
