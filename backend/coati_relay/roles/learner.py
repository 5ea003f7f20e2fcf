"""The learner: the algorithm of one consumer rank, apart from the consumer's transport (`roles.consumer`), so that a
colocated run, `ConsumerWorker.for_models` and tests train without Ray.

Per round (``P`` prompts on this rank, ``G`` responses each, ``N = P*G`` sequences, ``R`` response tokens): the
advantages come from the estimator registered under ``grpo_config['algo']`` (else ``core_algo``;
`coati_relay.algorithms.estimators`), fed the rewards [N], the reference model's log-probs [N, R] when its KL weight
is > 0, and a critic's values [N, R] when the estimator's spec asks for one (PPO; the critic then learns with the
clipped value loss). The policy loss carries ``beta * KL`` unless the estimator put the KL into rewards or
advantages itself. Behaviour log-probs: the producer's, which are those of the tempered distribution; with
``top_k``/``top_p`` they are of the truncated distribution instead, so the policy recomputes them over the full one
before the round's first update (one forward without gradient), as the legacy experience maker did.

Optimizer steps: ``train_batch_size`` prompts each (`Learner.optimizer_step`); their gradients accumulate over
forward chunks of ``min(train_microbatch_size, train_minibatch_size * G)`` sequences, on a CPU cut further to at
most `CPU_FORWARD_TOKENS` tokens a forward (`micro_batches`). The loss is that of the step's
whole batch (all ranks, all micro-batches): each micro-batch's loss is its sum over kept samples (tokens) divided by
the kept samples (tokens) summed over the data-parallel group, and is multiplied by the group's size, since the
plugins average gradients over it. The policy loss, the value loss and the KL estimator are the functions registered
under the names the algorithm settings give (``policy_loss``, ``value_loss``, ``kl_estimator``;
`coati_relay.algorithms.registry` documents their signatures). The metrics stay tensors on the training device over
the micro-batches and are read once, after them: each read waits for a GPU.
"""
from __future__ import annotations

import logging
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import nn

from coati_relay import algorithms as algos
from coati_relay.cluster.devices import to_device
from coati_relay.config.schema import Batches, RunConfig
from coati_relay.roles.logprobs import response_logprobs
from coati_relay.rollout import Rollout
from coati_relay.training.distributed import all_reduce_min, all_reduce_sum
from coati_relay.training.dropout import disable_dropout
from coati_relay.training.plugins import plugin_for_plain_module, precision_dtype, with_accumulation
from coati_relay.training.rank_phases import RankPhases
from coati_relay.training.schedule import COLOSSALCHAT_MIN_LR_RATIO, colossalchat_cosine_rounds
from coati_relay.training.step_plan import StepPlan, agree_on_plan

log = logging.getLogger(__name__)


class StepRows(NamedTuple):
    """Rows of a round on the training device. seq, attn: [n, S]; mask: [n, R] float; old_logp: [n, R] behaviour
    log-probs; adv: [n, 1] or [n, R]; loss_mask: [n]; ref_logp, values, returns: [n, R] or None."""

    seq: torch.Tensor
    attn: torch.Tensor
    mask: torch.Tensor
    old_logp: torch.Tensor
    adv: torch.Tensor
    loss_mask: torch.Tensor
    ref_logp: Optional[torch.Tensor]
    values: Optional[torch.Tensor]
    returns: Optional[torch.Tensor]

    def take(self, rows: slice) -> "StepRows":
        return StepRows(*(None if t is None else t[rows] for t in self))


def _add(d: Dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    d[key] = value if key not in d else d[key] + value


def micro_batch_rows(batches: Batches) -> int:
    """Sequences per forward of an optimizer step, whose gradients accumulate over the step's
    ``train_batch_size * num_generations`` sequences."""
    return min(batches.train_microbatch_size, batches.train_minibatch_size * batches.num_generations)


# Tokens (rows x padded columns) of one training forward on a CPU. Past a few thousand tokens a CPU's throughput has
# stopped growing while the activations and the heap's high-water mark grow with the rows: the 3.5M model at 157
# columns, bf16 autocast, 2 threads, trained a round of 64 rows in 0.75 s in forwards of 16 rows and 0.73 s in
# forwards of 32, and one forward and backward of 32 rows raised the RSS by 836 MiB against 433 for 16.
CPU_FORWARD_TOKENS = 4096


def micro_batches(n: int, minibatch: int, micro: int, columns: int = 0,
                  forward_tokens: Optional[int] = None) -> List[Tuple[slice, slice, int]]:
    """The forward chunks of an optimizer step of ``n`` rows: ``(its mini-batch, its rows, the rows of its
    micro-batch)`` for each, in order. A mini-batch is ``minibatch`` rows (``train_minibatch_size * G``), cut into
    micro-batches of ``micro`` rows, the last of each maybe shorter (as ColossalChat's consumer cuts each mini-batch
    it steps on). With ``forward_tokens``, a micro-batch of more than that many tokens (rows x ``columns``) runs as
    that many equal chunks fewer: the same gradient, up to float rounding; its loss divides by its own rows where
    ColossalChat's sample-level loss does (the third item)."""
    micro = max(1, min(micro, minibatch))
    out = []
    for m in range(0, n, minibatch):
        end = min(m + minibatch, n)
        for s in range(m, end, micro):
            rows = min(s + micro, end) - s
            pieces = 1 if not forward_tokens else max(1, min(rows, -(-rows * columns // forward_tokens)))
            bounds = [s + rows * i // pieces for i in range(pieces + 1)]
            out += [(slice(m, end), slice(a, b), rows) for a, b in zip(bounds, bounds[1:])]
    return out


class Learner:
    """The algorithm of one data-parallel consumer rank, apart from its transport (`ConsumerWorker`: the queue,
    the rendezvous, publishing, the checkpoint cadence): the advantages, ``ppo_epochs`` passes of optimizer steps,
    the log-probs and values they need, the loss mask of the filters, and the statistics over the ranks."""

    def __init__(self, cfg: RunConfig, rank: int, policy: nn.Module, reference: Optional[nn.Module] = None,
                 critic: Optional[nn.Module] = None, pad_token_id: int = 0) -> None:
        """The training backends and the reference model, all on the training device (`coati_relay.cluster.devices`).
        ``pad_token_id``: what pads the rollouts of different rounds that dynamic batching joins."""
        self.cfg, self.rank, self.world_size, self.pad_token_id = cfg, rank, cfg.roles.num_consumers, pad_token_id
        # what this rank does, for the errors of a collective that cannot complete (`training.rank_phases`)
        self.phases = RankPhases(rank, self.world_size, cfg.roles.collective_timeout_s, cfg.roles.timeout_s)
        self._carry: Optional[Rollout] = None  # dynamic batching: kept groups short of a whole step, for next round
        self._share_prompts = False  # this round's choice (`_prompt_sharing`)
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
        if not cfg.models.keep_dropout:  # train and eval forwards agree: an unchanged policy's first KL is 0
            dropped = sum(disable_dropout(m) for m in (policy, reference, critic) if m is not None)
            if dropped and rank == 0:
                log.info("dropout off in %d places of the trained models (train_model_config['keep_dropout']=True "
                         "keeps it)", dropped)
        steps_per_round = cfg.optimizer_steps_per_round * a.ppo_epochs
        total_steps, min_lr_ratio, rounds = cfg.total_rounds * steps_per_round, 0.0, cfg.total_rounds
        if a.lr_scheduler == "colossalchat":  # ColossalChat's cosine, in rounds (`training.schedule`)
            total_steps = colossalchat_cosine_rounds(cfg.batches.num_episodes, cfg.rounds_per_episode)
            min_lr_ratio = COLOSSALCHAT_MIN_LR_RATIO
            if cfg.zero_bubble:  # ColossalChat's zero-bubble consumer steps its cosine once per optimizer step
                total_steps = colossalchat_cosine_rounds(cfg.batches.num_episodes,
                                                         cfg.rounds_per_episode * steps_per_round)
                rounds, steps_per_round = cfg.total_rounds * steps_per_round, 1
        b = cfg.batches
        chunks = len(micro_batches(b.train_batch_size * b.num_generations, b.train_minibatch_size * b.num_generations,
                                   micro_batch_rows(b)))
        common = dict(plugin=cfg.plugin.name,
                      plugin_options=with_accumulation(cfg.plugin.name, cfg.plugin.options, chunks),
                      allow_cpu_fallback=cfg.plugin.allow_cpu_fallback,
                      max_grad_norm=a.max_grad_norm, scheduler=a.lr_scheduler, total_steps=total_steps,
                      warmup_steps=a.warmup_steps, weight_decay=a.weight_decay, min_lr_ratio=min_lr_ratio,
                      steps_per_round=steps_per_round, rounds=rounds)
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
            self.policy.prepare_forwards(self.reference)
        s = cfg.sampling
        # A truncated sampler (top-k/top-p) reports the log-probs of the renormalised truncated distribution; the
        # losses need the full one's, so train_round recomputes them.
        self.recompute_behaviour = s.top_k > 0 or s.top_p < 1.0
        if self.recompute_behaviour and self.rank == 0:
            log.info("top_k=%d, top_p=%s: old log-probs are recomputed over the full distribution each round",
                     s.top_k, s.top_p)

    def train_round(self, batch: Rollout, round_: int = -1) -> Dict[str, float]:
        """Advantages, then ``ppo_epochs`` passes of optimizer steps over this rank's share of a round (``round_``:
        its index, for the errors of `training.rank_phases`).

        Every rank of the data-parallel group calls it on a batch of the same number of rows (collectives: the
        counts of each step, the statistics at the end). With ``filter_range`` and ``dynamic_batching`` (ColossalChat's
        default), the groups outside the range leave the round and the kept ones fill optimizer steps of
        ``train_batch_size`` groups; the groups short of a whole step (on the rank with the fewest) wait for the next
        round, where they train beside its groups (`_dynamic_batch`).
        """
        a = self.cfg.algo
        stats: Dict[str, float] = {"reward": batch.rewards.float().mean().item(),
                                   "response_length": batch.response_lengths.float().mean().item()}
        by_group = batch.rewards.float().view(-1, batch.group_size)  # groups whose rewards are all equal train nothing
        stats["frac_reward_zero_std"] = (by_group.amax(1) == by_group.amin(1)).float().mean().item()
        if a.filter_range and a.dynamic_batching:
            with self.phases.phase("log-probs", round_):
                batch = self._dynamic_batch(batch, stats)
            if not batch.num_sequences:  # the same on every rank: no step this round, the weights stay
                return self.over_ranks({**stats, "skipped_steps": 1.0}, round_)
        num_resp = batch.response_ids.size(1)
        self._share_prompts = self._prompt_sharing(batch, round_)
        seq, attn, mask, behaviour, rewards, lengths = to_device(
            self.device, batch.sequences, batch.attention_mask, batch.response_mask.float(), batch.logprobs,
            batch.rewards.float(), batch.response_lengths)
        g = batch.group_size
        self.eval_mode()  # no dropout in the old log-probs and values; `optimizer_step` restores train mode
        with torch.no_grad(), self.phases.phase("log-probs", round_):
            old_logp = behaviour
            if self.recompute_behaviour:
                old_logp = self.logprobs_chunked(self.policy.model, seq, attn, num_resp)
                stats["behaviour_logp_gap"] = algos.masked_mean(behaviour - old_logp, mask).item()
            ref_logp = None
            if self.reference is not None:
                ref_logp = self.logprobs_chunked(self.reference, seq, attn, num_resp)
            values = None
            if self.critic is not None:
                values = self.values(seq, attn, batch.prompt_ids.size(1), num_resp)
            out = self.estimator(algos.AdvantageInputs(rewards, g, mask, old_logp, ref_logp, values), a)
            loss_mask = self.loss_mask(_accuracy(batch).to(self.device), lengths, g,
                                        by_range=not a.dynamic_batching)
        stats["kept_fraction"] = loss_mask.mean().item()
        rows = StepRows(seq, attn, mask, old_logp, out.advantages, loss_mask, ref_logp, values, out.returns)
        per_step = self.cfg.batches.train_batch_size * g
        starts = [start for _ in range(a.ppo_epochs) for start in range(0, batch.num_sequences, per_step)]
        step_stats = [self.optimizer_step(rows.take(slice(start, start + per_step)), num_resp,
                                          where=(round_, i, len(starts))) for i, start in enumerate(starts)]
        for key in sorted({k for st in step_stats for k in st}):
            present = [st[key] for st in step_stats if key in st]
            stats[key] = sum(present) / len(present)
        return self.over_ranks(stats, round_)

    def _prompt_sharing(self, batch: Rollout, round_: int) -> bool:
        """Whether the policy's forwards share each group's prompt this round (`inference.prompt_sharing`). Alone,
        wherever the model allows. In a data-parallel group, DDP broadcasts the model's buffers in each forward, so
        every rank must run as many forwards: the ranks share prompts (two forwards a chunk) only where every one of
        them can, with groups of several samples, and otherwise run one forward a chunk."""
        if self.world_size == 1:
            return self.policy.shares_prompts
        able = self.policy.shares_prompts and batch.group_size > 1 and batch.prompt_ids.size(1) >= 2
        with self.phases.phase("log-probs", round_):
            return all_reduce_min(int(able)) == 1

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
        carry = self._carry
        parts = ([carry] if carry is not None else []) + [batch.take_groups(kept)]
        pool = Rollout.concat(parts, self.pad_token_id)
        ready = all_reduce_min(pool.num_prompts // tbs) * tbs
        self._carry = pool.take_groups(range(ready, pool.num_prompts)) if ready < pool.num_prompts else None
        stats["carried_groups"] = float(pool.num_prompts - ready)
        return pool.take_groups(range(ready))

    def eval_mode(self) -> None:
        self.policy.model.eval()
        if self.critic is not None:
            self.critic.model.eval()

    def logprobs(self, model, seq, attn, num_resp) -> torch.Tensor:
        """[N, R] log-probs of the policy (``self.policy.model``) or the reference model; the samples of a group
        share one forward of their prompt where the model allows (`coati_relay.inference.prompt_sharing`). Both
        forwards in the policy's precision (`TrainingBackend.forward_precision`): at the first step they agree."""
        t = self.cfg.sampling.temperature
        with self.policy.forward_precision():
            if model is self.policy.model:
                return response_logprobs(model, seq, attn, num_resp, temperature=t, causal_lm=self.policy.causal_lm,
                                         share_prompts=self._share_prompts, fixed_forwards=self.world_size > 1)
            return response_logprobs(model, seq, attn, num_resp, temperature=t, share_prompts=True)

    def logprobs_chunked(self, model, seq, attn, num_resp) -> torch.Tensor:
        """`logprobs` in forward chunks of the micro-batch size (no gradient): [N, R]."""
        micro = self.cfg.batches.train_microbatch_size
        return torch.cat([self.logprobs(model, seq[s:s + micro], attn[s:s + micro], num_resp)
                          for s in range(0, seq.size(0), micro)])

    def values(self, seq, attn, prompt_len: int, num_resp: int) -> torch.Tensor:
        """Critic value of the state before each response token: positions P-1 .. P+R-2 -> [N, R]."""
        with self.critic.forward_precision():
            v = self.critic.model(seq, attention_mask=attn)
        return v[:, prompt_len - 1: prompt_len - 1 + num_resp].float()

    def loss_mask(self, accuracy: torch.Tensor, lengths: torch.Tensor, group_size: int,
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


    def over_ranks(self, stats: Dict[str, float], round_: int = -1) -> Dict[str, float]:
        """The statistics of the whole data-parallel group: losses summed (each rank holds its share of the
        batch's loss), the others averaged (every rank trains on as many rows). The keys are the same on every
        rank (they follow the configuration and the all-reduced counts)."""
        if self.world_size == 1:
            return stats
        keys = sorted(stats)
        with self.phases.phase("statistics", round_):
            total = all_reduce_sum(torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64,
                                                device=self.device)).tolist()
        return {k: v if k in _SUMMED_STATS else v / self.world_size for k, v in zip(keys, total)}

    def optimizer_step(self, rows: StepRows, num_resp: int, where: tuple = (-1, 0, 1)) -> Dict[str, float]:
        """One optimizer step over ``rows`` [n = train_batch_size * G], in micro-batches of `micro_batch_rows`;
        returns the step's metrics. ``where``: (round, this step's index, the round's optimizer steps), which the
        ranks compare before the step's backward passes (`training.step_plan`) and errors name."""
        b = self.cfg.batches
        round_, step, steps = where
        n = rows.seq.size(0)
        kept = rows.mask * rows.loss_mask.unsqueeze(1)  # [n, R] the tokens that train
        with self.phases.phase("backward", round_, step):
            # on a CPU, forwards of at most CPU_FORWARD_TOKENS tokens at the widest rank's columns (the same chunks
            # on every rank)
            cpu = self.device.type == "cpu"
            columns = -all_reduce_min(-rows.seq.size(1)) if cpu else 0
            chunks = micro_batches(n, b.train_minibatch_size * b.num_generations, micro_batch_rows(b), columns,
                                   CPU_FORWARD_TOKENS if cpu else None)
            # the step's counts over the ranks: kept tokens, kept samples, valid tokens, then the kept tokens of each
            # chunk's mini-batch (loss_normalization 'colossalchat')
            counts = all_reduce_sum(torch.stack([kept.sum(), rows.loss_mask.sum(), rows.mask.sum(),
                                                 *(kept[mb].sum() for mb, _, _ in chunks)]))
            host_counts = counts.tolist()  # the step's one host sync before its update
            train_policy = host_counts[1] > 0  # the same on every rank
            agree_on_plan(StepPlan(len(chunks), train_policy, self.critic is not None, steps), self.rank,
                          round_, step)
        if not train_policy and self.critic is None:
            return {"skipped_steps": 1.0}
        with self.phases.phase("backward", round_, step):
            sums = self._backward(rows, num_resp, chunks, train_policy, [max(c, 1.0) for c in host_counts])
        keys = sorted(sums)
        stats = dict(zip(keys, torch.stack([sums[k].float() for k in keys]).tolist()))
        stats["skipped_steps"] = 0.0 if train_policy else 1.0
        with self.phases.phase("optimizer step", round_, step):
            if train_policy:
                out = self.policy.step()
                stats["lr"] = float(out["lr"])
                if out["grad_norm"] is not None:
                    stats["grad_norm"] = out["grad_norm"]
            self.policy.zero_grad()
            if self.critic is not None:
                self.critic.step()
                self.critic.zero_grad()
        return stats

    def _backward(self, rows: StepRows, num_resp: int, chunks: List[Tuple[slice, slice, int]], train_policy: bool,
                  counts: List[float]) -> Dict[str, torch.Tensor]:
        """The backward passes of one optimizer step over ``rows``, one a chunk of ``chunks`` ((its mini-batch, its
        rows, its micro-batch's rows): `micro_batches`); ``counts``: kept tokens, kept samples and valid tokens of
        the whole step over the ranks, then the kept tokens of each chunk's mini-batch. Returns the step's metric
        sums, on the device.

        What a micro-batch's policy loss is divided by (``loss_normalization``): 'step', the step's kept samples
        (tokens) over the ranks, times the ranks (the plugins average the gradients over them), so that the step's
        gradient is that of its whole batch; 'colossalchat', as ColossalChat's consumer: sample_level by the
        micro-batch's rows, token_level by its mini-batch's kept tokens over the ranks, backward unscaled."""
        a = self.cfg.algo
        kept_tokens, kept_samples, valid_tokens, *minibatch_tokens = counts
        as_colossalchat = a.loss_normalization == "colossalchat"
        n = rows.seq.size(0)
        sums: Dict[str, torch.Tensor] = {}  # on the device, read once after the step
        dp = self.world_size
        # The run's functions by their registered names (grpo_config): the built-ins or the user's own.
        policy_loss, kl_estimate = algos.get("policy_loss", a.policy_loss), algos.get("kl", a.kl_estimator)
        self.policy.train()
        for i, (_, micro, micro_rows) in enumerate(chunks):
            part = rows.take(micro)
            share = part.seq.size(0) / n
            if train_policy:
                logp = self.logprobs(self.policy.model, part.seq, part.attn, num_resp)
                kl = None if part.ref_logp is None else kl_estimate(logp, part.ref_logp)
                tokens, samples, scale = kept_tokens, kept_samples, dp
                if as_colossalchat:
                    tokens, samples, scale = minibatch_tokens[i], micro_rows, 1
                loss, st = policy_loss(
                    logp, part.old_logp, part.adv, part.mask, clip_eps_low=a.clip_eps_low,
                    clip_eps_high=a.clip_eps_high, aggregation=a.loss_variation, per_token_kl=kl,
                    beta=a.beta if self.spec.kl_in_loss else 0.0, loss_mask=part.loss_mask,
                    total_tokens=tokens, num_samples=samples, stats_on_host=False)
                self.policy.backward(loss * scale)
                _add(sums, "loss", loss.detach())
                if "clip_frac" in st:
                    _add(sums, "clip_frac", torch.as_tensor(st["clip_frac"], dtype=torch.float32,
                                                            device=loss.device) * share)
                if kl is not None:
                    _add(sums, "kl", algos.masked_mean(kl, part.mask).detach() * share)
            if self.critic is not None:
                self.critic.train()
                v = self.values(part.seq, part.attn, part.seq.size(1) - num_resp, num_resp)
                vloss = algos.get("value_loss", a.value_loss)(v, part.values, part.returns, clip_eps=a.value_clip,
                                                              mask=part.mask, total_tokens=valid_tokens)
                self.critic.backward(vloss * dp)
                _add(sums, "value_loss", vloss.detach())
        return sums


_SUMMED_STATS = {"loss", "value_loss"}


def _accuracy(batch: Rollout) -> torch.Tensor:
    """[N] what ``filter_range`` compares: the answer accuracy a rule reward gives (ColossalChat's ans_acc), else
    the reward (registered or callable rewards, a reward model)."""
    return (batch.ans_acc if batch.ans_acc is not None else batch.rewards).float()
