"""One optimizer step of a consumer rank (`ConsumerWorker.train_round` runs one per ``train_batch_size`` prompts):
the step's rows, the rows per forward, and the step over its micro-batches.

The loss is that of the step's whole batch (all ranks, all micro-batches): each micro-batch's loss is its sum over
kept samples (tokens) divided by the kept samples (tokens) summed over the data-parallel group, and is multiplied by
the group's size, since the plugins average gradients over it. The policy loss, the value loss and the KL estimator
are the functions registered under the names the algorithm settings give (``policy_loss``, ``value_loss``,
``kl_estimator``; `coati_relay.algorithms.registry` documents their signatures). The metrics stay tensors on the
training device over the micro-batches and are read once, after them: each read waits for a GPU.
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

import torch

from coati_relay import algorithms as algos
from coati_relay.config.schema import Batches
from coati_relay.training.distributed import all_reduce_sum


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


def optimizer_step(worker: Any, rows: StepRows, num_resp: int) -> Dict[str, float]:
    """One optimizer step of ``worker`` (a `ConsumerWorker`: its config, backends, algorithm spec and forwards)
    over ``rows`` [n = train_batch_size * G], in micro-batches of `micro_batch_rows`; returns the step's metrics."""
    a, b = worker.cfg.algo, worker.cfg.batches
    n = rows.seq.size(0)
    micro = min(micro_batch_rows(b), n)
    counts = all_reduce_sum(torch.stack([(rows.mask * rows.loss_mask.unsqueeze(1)).sum(), rows.loss_mask.sum(),
                                         rows.mask.sum()]))
    host_counts = counts.tolist()  # the step's one host sync before its update
    kept_tokens, kept_samples, valid_tokens = (max(c, 1.0) for c in host_counts)
    train_policy = host_counts[1] > 0  # the same on every rank
    if not train_policy and worker.critic is None:
        return {"skipped_steps": 1.0}
    sums: Dict[str, torch.Tensor] = {}  # on the device, read once after the step
    dp = worker.world_size
    # The run's functions by their registered names (grpo_config): the built-ins or the user's own.
    policy_loss, kl_estimate = algos.get("policy_loss", a.policy_loss), algos.get("kl", a.kl_estimator)
    worker.policy.train()
    for s in range(0, n, micro):
        part = rows.take(slice(s, s + micro))
        share = part.seq.size(0) / n
        if train_policy:
            logp = worker._logprobs(worker.policy.model, part.seq, part.attn, num_resp)
            kl = None if part.ref_logp is None else kl_estimate(logp, part.ref_logp)
            loss, st = policy_loss(
                logp, part.old_logp, part.adv, part.mask, clip_eps_low=a.clip_eps_low,
                clip_eps_high=a.clip_eps_high, aggregation=a.loss_variation, per_token_kl=kl,
                beta=a.beta if worker.spec.kl_in_loss else 0.0, loss_mask=part.loss_mask,
                total_tokens=kept_tokens, num_samples=kept_samples, stats_on_host=False)
            worker.policy.backward(loss * dp)
            _add(sums, "loss", loss.detach())
            if "clip_frac" in st:
                _add(sums, "clip_frac", torch.as_tensor(st["clip_frac"], dtype=torch.float32,
                                                        device=loss.device) * share)
            if kl is not None:
                _add(sums, "kl", algos.masked_mean(kl, part.mask).detach() * share)
        if worker.critic is not None:
            worker.critic.train()
            v = worker._values(part.seq, part.attn, part.seq.size(1) - num_resp, num_resp)
            vloss = algos.get("value_loss", a.value_loss)(v, part.values, part.returns, clip_eps=a.value_clip,
                                                          mask=part.mask, total_tokens=valid_tokens)
            worker.critic.backward(vloss * dp)
            _add(sums, "value_loss", vloss.detach())
    keys = sorted(sums)
    stats = dict(zip(keys, torch.stack([sums[k].float() for k in keys]).tolist()))
    stats["skipped_steps"] = 0.0 if train_policy else 1.0
    if train_policy:
        out = worker.policy.step()
        stats["lr"] = float(out["lr"])
        if out["grad_norm"] is not None:
            stats["grad_norm"] = out["grad_norm"]
    worker.policy.zero_grad()
    if worker.critic is not None:
        worker.critic.step()
        worker.critic.zero_grad()
    return stats
