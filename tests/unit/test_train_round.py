"""`ConsumerWorker.train_round` on hand-made batches and toy models (no Ray): where tensors go, DAPO's filters, the
number of optimizer steps, micro-batch accumulation, where the KL goes, and the behaviour log-probs of a truncated
sampler. Expected gradients are written out with plain tensor operations: on-policy, the first step has ratio 1, so
the clipped surrogate's gradient is ``-A * grad(logp)``."""
from __future__ import annotations

import pytest
import torch
from train_round_helpers import (
    BigramLM,
    OffDevice,
    TokenCritic,
    make_config,
    make_rollout,
    off_device,
    record_steps,
)

from coati_relay.roles import learner as learner_module
from coati_relay.roles.consumer import ConsumerWorker
from coati_relay.roles.logprobs import response_logprobs

PROMPTS = [[3, 4, 5], [6], [7, 8], [9, 10]]
RESPONSES = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [2, 2], [3, 11, 4], [5], [6, 7, 8]]


@pytest.fixture(scope="module")
def paths(tiny_model_path, tmp_path_factory):
    from coati_relay.toy import write_toy_dataset

    return tiny_model_path, str(write_toy_dataset(tmp_path_factory.mktemp("data") / "p.jsonl", num_prompts=16))


def _grads_of(loss_fn, model) -> torch.Tensor:
    model.zero_grad()
    loss_fn(model).backward()
    return model.table.grad.clone()


def _logp(model, rollout) -> torch.Tensor:
    return response_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.response_ids.size(1))


def _surrogate(logp, adv) -> torch.Tensor:
    """-A * ratio per token with ratio = exp(logp - logp.detach()) = 1: its gradient is -A * grad(logp)."""
    return -adv * (logp - logp.detach()).exp()


# -- devices ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["GRPO", "PPO"])
def test_a_batch_off_the_models_device_trains_only_through_the_device_helper(paths, algo, monkeypatch):
    """Every rollout tensor stands for one on another device than the models (`OffDevice`): the round trains
    (policy, reference, critic and the recomputed behaviour log-probs all see moved tensors), and fails as on a GPU
    host as soon as the consumer's move is taken away."""
    critic = TokenCritic() if algo == "PPO" else None
    cfg = make_config(*paths, core_algo=algo, group_size=2, beta=0.1, kl_coef=0.1, generate={"top_k": 4})
    rollout = off_device(make_rollout(PROMPTS[:2], RESPONSES[:4], 2, [1.0, 0.0, 0.5, 0.0], policy=BigramLM()))
    assert isinstance(rollout.sequences, OffDevice)
    worker = ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1), critic=critic)
    stats = worker.train_round(rollout)
    assert stats["loss"] != 0 and stats["kl"] > 0 and ("value_loss" in stats) == (algo == "PPO")

    monkeypatch.setattr(learner_module, "to_device", lambda device, *tensors: tensors)
    with pytest.raises(RuntimeError, match="same device"):
        worker.train_round(rollout)


def test_reward_model_moves_the_producers_sequences_to_its_device(monkeypatch):
    """The producer's scoring with a reward model (`ProducerWorker._score`): the scorer moves the rollout to the
    reward model's device; without that move the reward model refuses the input."""
    from types import SimpleNamespace

    from coati_relay.rewards import RewardModelScorer
    from coati_relay.rewards import reward_model as reward_model_module
    from coati_relay.roles.producer import ProducerWorker

    rollout = off_device(make_rollout(PROMPTS[:2], RESPONSES[:4], 2, [0.0] * 4))
    producer = ProducerWorker(0, SimpleNamespace(), queue=None, weight_store=None)
    producer.rm_scorer = RewardModelScorer(TokenCritic(seed=3), device="cpu")
    scores = producer._score(rollout, ["", ""])
    last = rollout.response_ids.gather(1, (rollout.response_lengths - 1).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(scores, TokenCritic(seed=3).value.detach()[last.as_subclass(torch.Tensor)])

    monkeypatch.setattr(reward_model_module, "to_device", lambda device, *tensors: tensors)
    with pytest.raises(RuntimeError, match="same device"):
        producer._score(rollout, ["", ""])


# -- DAPO filters, steps, micro-batches ------------------------------------------------------------------------------
def test_dapo_filters_train_only_the_kept_sample(paths):
    """Rewards [0,0 | 1,0 | 1,1] with filter_range (0.01, 0.99): groups 0 and 2 drop. Row 3 (4 tokens =
    max_new_tokens) is truncated and drops too. Only row 2 trains: token-level loss -A * sum_t logp_t / 2 with
    A = 0.5 / (std([1, 0]) + 1e-4)."""
    cfg = make_config(*paths, core_algo="DAPO", train_batch_size=4, dynamic_batching=False)
    prompts, responses = PROMPTS[:3], [[1, 2], [3, 4, 5], [6, 7], [8, 9, 10, 11], [2], [3, 4]]
    rollout = make_rollout(prompts, responses, 2, [0.0, 0.0, 1.0, 0.0, 1.0, 1.0], policy=BigramLM())
    worker = ConsumerWorker.for_models(cfg, BigramLM())
    grads = record_steps(worker)
    stats = worker.train_round(rollout)
    assert stats["kept_fraction"] == pytest.approx(1 / 6)

    adv = 0.5 / (torch.tensor([1.0, 0.0]).std() + 1e-4)
    row2 = make_rollout([prompts[1]], [responses[2]], 1, [1.0])
    expected = _grads_of(lambda m: _surrogate(_logp(m, row2), adv).sum() / 2, BigramLM())
    torch.testing.assert_close(grads[0]["table"], expected, rtol=1e-5, atol=1e-7)


def test_no_kept_sample_anywhere_skips_the_optimizer_step(paths):
    """Every group all-wrong or all-right: DAPO keeps nothing, and the step is skipped (no momentum-only update)."""
    cfg = make_config(*paths, core_algo="DAPO", train_batch_size=2, dynamic_batching=False)
    rollout = make_rollout(PROMPTS[:2], [[1], [2], [3], [4]], 2, [0.0, 0.0, 1.0, 1.0], policy=BigramLM())
    worker = ConsumerWorker.for_models(cfg, BigramLM())
    grads = record_steps(worker)
    before = worker.policy.unwrapped().table.detach().clone()
    stats = worker.train_round(rollout)
    assert grads == [] and stats["skipped_steps"] == 1.0 and stats["kept_fraction"] == 0.0
    assert torch.equal(worker.policy.unwrapped().table.detach(), before)


@pytest.mark.parametrize("epochs,train_batch_size,steps", [(1, 1, 4), (3, 2, 6), (2, 4, 2)])
def test_ppo_epochs_times_steps_per_pass_optimizer_steps(paths, epochs, train_batch_size, steps):
    cfg = make_config(*paths, train_batch_size=train_batch_size, ppo_epochs=epochs, beta=0.0)
    rollout = make_rollout(PROMPTS, RESPONSES, 2, [1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.2], policy=BigramLM())
    worker = ConsumerWorker.for_models(cfg, BigramLM())
    grads = record_steps(worker)
    worker.train_round(rollout)
    assert len(grads) == steps


@pytest.mark.parametrize("variation", ["sample_level", "token_level"])
def test_micro_batches_accumulate_the_whole_batch_gradient(paths, variation):
    """Off-policy rows (clipping active), a KL term and a filtered group: one forward of 8 rows and 8 forwards of
    one row give the same gradient."""
    rollout = make_rollout(PROMPTS, RESPONSES, 2, [1.0, 0.0, 0.0, 0.0, 0.5, 0.0, 1.0, 0.2], policy=BigramLM(),
                           logprob_shift=0.5)
    found = []
    for micro in (8, 1):
        cfg = make_config(*paths, train_batch_size=4, microbatch=micro, beta=0.2, loss_variation=variation,
                          filter_range=[0.01, 0.99], dynamic_batching=False)
        worker = ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1))
        grads = record_steps(worker)
        stats = worker.train_round(rollout)
        found.append(grads[0]["table"])
    assert stats["kept_fraction"] == 0.75 and stats["clip_frac"] > 0
    torch.testing.assert_close(found[1], found[0], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("normalization", ["step", "colossalchat"])
@pytest.mark.parametrize("variation", ["sample_level", "token_level"])
def test_a_cpu_cuts_a_micro_batch_of_many_tokens_into_forwards_with_the_same_gradient(paths, monkeypatch,
                                                                                      variation, normalization):
    """A micro-batch of 8 rows past `CPU_FORWARD_TOKENS` runs as several forwards; ColossalChat's sample-level loss
    still divides by the micro-batch's 8 rows."""
    rollout = make_rollout(PROMPTS, RESPONSES, 2, [1.0, 0.0, 0.0, 0.0, 0.5, 0.0, 1.0, 0.2], policy=BigramLM(),
                           logprob_shift=0.5)
    columns = rollout.sequences.size(1)
    found, forwards = [], []
    for budget in (8 * columns, 3 * columns):  # one forward of 8 rows; then 3 of 2 or 3 rows
        monkeypatch.setattr(learner_module, "CPU_FORWARD_TOKENS", budget)
        cfg = make_config(*paths, train_batch_size=4, microbatch=8, beta=0.2, loss_variation=variation,
                          loss_normalization=normalization)
        policy = BigramLM()
        calls = []
        policy.register_forward_hook(lambda module, args, kwargs, out: calls.append(out.size(0)), with_kwargs=True)
        worker = ConsumerWorker.for_models(cfg, policy, reference=BigramLM(seed=1))
        grads = record_steps(worker)
        worker.train_round(rollout)
        found.append(grads[0]["table"])
        forwards.append(calls)
    assert forwards == [[8], [2, 3, 3]]
    torch.testing.assert_close(found[1], found[0], rtol=1e-5, atol=1e-7)


def test_micro_batches_cut_a_micro_batch_into_forwards_of_at_most_the_token_budget():
    whole = learner_module.micro_batches(64, 64, 32)
    assert whole == [(slice(0, 64), slice(0, 32), 32), (slice(0, 64), slice(32, 64), 32)]
    cut = learner_module.micro_batches(64, 64, 32, columns=157, forward_tokens=4096)
    assert [(c.start, c.stop, rows) for _, c, rows in cut] == [(0, 16, 32), (16, 32, 32), (32, 48, 32), (48, 64, 32)]
    assert learner_module.micro_batches(64, 64, 16, columns=157, forward_tokens=4096) == \
        learner_module.micro_batches(64, 64, 16)
    # uneven: a micro-batch of 5 rows of 2,000 columns in forwards of at most 4,096 tokens; never an empty one
    cut = learner_module.micro_batches(5, 5, 5, columns=2000, forward_tokens=4096)
    assert [(c.start, c.stop) for _, c, _ in cut] == [(0, 1), (1, 3), (3, 5)]
    assert len(learner_module.micro_batches(2, 2, 2, columns=10 ** 6, forward_tokens=4096)) == 2
    no_columns = learner_module.micro_batches(4, 4, 4, columns=0, forward_tokens=4096)
    assert no_columns == learner_module.micro_batches(4, 4, 4)


# -- where the KL goes -----------------------------------------------------------------------------------------------
def test_grpo_puts_beta_times_kl_into_the_loss(paths):
    """Equal rewards in every group: A = 0, so the whole gradient is that of beta * mean_b masked_mean_t k3, with
    k3 = exp(x) - 1 - x and x = ref_logp - logp written out here (not the KL code under test)."""
    beta = 0.5
    cfg = make_config(*paths, train_batch_size=4, beta=beta)
    rollout = make_rollout(PROMPTS, RESPONSES, 2, [1.0, 1.0, 0.0, 0.0, 0.3, 0.3, 1.0, 1.0], policy=BigramLM())
    worker = ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1))
    grads = record_steps(worker)
    worker.train_round(rollout)

    ref = _logp(BigramLM(seed=1), rollout).detach()
    mask = rollout.response_mask.float()

    def loss(m):
        x = ref - _logp(m, rollout)
        k3 = x.exp() - 1 - x
        return beta * ((k3 * mask).sum(1) / mask.sum(1)).mean()

    expected = _grads_of(loss, BigramLM())
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(grads[0]["table"], expected, rtol=1e-5, atol=1e-7)


def _hand_ppo_advantages(rewards, logp, ref, values, lengths, kl_coef, gamma, lam) -> torch.Tensor:
    """PPO's advantages [N, R] written out one row and one token at a time: token rewards -kl_coef * (logp - ref)
    plus the reward on the last token, GAE backwards over the row's tokens (V = 0 past the end), then whitened
    over all valid tokens (population variance, eps 1e-8)."""
    adv = torch.zeros_like(values)
    for i, n in enumerate(lengths.tolist()):
        token_rewards = [-kl_coef * float(logp[i, t] - ref[i, t]) for t in range(n)]
        token_rewards[-1] += float(rewards[i])
        next_value = next_adv = 0.0
        for t in reversed(range(n)):
            delta = token_rewards[t] + gamma * next_value - float(values[i, t])
            next_adv = delta + gamma * lam * next_adv
            adv[i, t] = next_adv
            next_value = float(values[i, t])
    valid = torch.arange(adv.size(1)) < lengths.unsqueeze(1)
    mean = adv[valid].mean()
    std = (((adv[valid] - mean) ** 2).mean() + 1e-8).sqrt()
    return (adv - mean) / std * valid


def test_ppo_puts_the_kl_into_the_rewards_not_the_loss(paths):
    """PPO (kl_in_loss False): the gradient is that of -A * ratio with A from GAE over rewards that carry
    -kl_coef * KL (advantages computed by hand here); beta (set here, large) must not add a KL term to the loss."""
    kl_coef = 0.5
    cfg = make_config(*paths, core_algo="PPO", group_size=1, train_batch_size=4, kl_coef=kl_coef, beta=0.5)
    assert (cfg.algo.gamma, cfg.algo.lam, cfg.algo.normalize_advantages) == (1.0, 0.95, True)
    prompts, responses = PROMPTS, RESPONSES[:4]
    rollout = make_rollout(prompts, responses, 1, [1.0, 0.0, 0.5, 0.2], policy=BigramLM())
    worker = ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1), critic=TokenCritic())
    grads = record_steps(worker)
    worker.train_round(rollout)

    mask = rollout.response_mask.float()
    p, r = rollout.prompt_ids.size(1), rollout.response_ids.size(1)
    with torch.no_grad():
        values = TokenCritic()(rollout.sequences, rollout.attention_mask)[:, p - 1:p - 1 + r]
        ref = _logp(BigramLM(seed=1), rollout)
    args = (rollout.rewards, rollout.logprobs, ref, values, rollout.response_lengths)
    advantages = _hand_ppo_advantages(*args, kl_coef=kl_coef, gamma=1.0, lam=0.95)
    assert not torch.allclose(advantages, _hand_ppo_advantages(*args, kl_coef=0.0, gamma=1.0, lam=0.95)), \
        "the reference must change the advantages"
    expected = _grads_of(lambda m: ((_surrogate(_logp(m, rollout), advantages) * mask).sum(1)
                                    / mask.sum(1)).mean(), BigramLM())
    torch.testing.assert_close(grads[0]["table"], expected, rtol=1e-5, atol=1e-7)


# -- behaviour log-probs of a truncated sampler ----------------------------------------------------------------------
def _top_k_rollout(policy: BigramLM, k: int):
    """Two prompts, two responses each, that follow each token's top-k successors, with the log-probs of the
    renormalised top-k distribution as behaviour log-probs (what vLLM's processed_logprobs and transformers'
    scores report)."""
    table = policy.table.detach()
    responses = []
    for start, offset in ((3, 0), (3, 1), (5, 0), (5, 2)):
        row, prev = [], start
        for j in range(3):
            prev = int(table[prev].topk(k).indices[(j + offset) % k])
            row.append(prev)
        responses.append(row)
    rollout = make_rollout([[3], [5]], responses, 2, [1.0, 0.0, 0.5, 0.0])
    logits = table[rollout.sequences[:, -4:-1]]
    kth = logits.topk(k, dim=-1).values[..., -1:]
    truncated = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)
    rollout.logprobs = truncated.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    return rollout


def test_top_k_sampling_recomputes_old_logprobs_over_the_full_distribution(paths):
    """With top_k the producer's log-probs (truncated) exceed the full distribution's, so taking them as old
    log-probs clips from the first step. The consumer recomputes them: ratio 1 on-policy, nothing clipped, and the
    gap is reported."""
    rollout = _top_k_rollout(BigramLM(), k=3)
    full = _logp(BigramLM(), rollout).detach()
    gap = float((rollout.logprobs - full).mean())
    assert gap > 0.1

    truncated_cfg = make_config(*paths, train_batch_size=2, beta=0.0, generate={"top_k": 3})
    stats = ConsumerWorker.for_models(truncated_cfg, BigramLM()).train_round(rollout)
    assert stats["clip_frac"] == 0.0
    assert stats["behaviour_logp_gap"] == pytest.approx(gap, rel=1e-5)

    plain_cfg = make_config(*paths, train_batch_size=2, beta=0.0)
    stats = ConsumerWorker.for_models(plain_cfg, BigramLM()).train_round(rollout)
    assert stats["clip_frac"] > 0 and "behaviour_logp_gap" not in stats, "untruncated: the producer's are used"


def test_for_models_refuses_missing_or_extra_models(paths):
    with pytest.raises(ValueError, match="needs a reference model"):
        ConsumerWorker.for_models(make_config(*paths, beta=0.1), BigramLM())
    with pytest.raises(ValueError, match="needs no reference model"):
        ConsumerWorker.for_models(make_config(*paths, beta=0.0), BigramLM(), reference=BigramLM())
    with pytest.raises(ValueError, match="trains a critic"):
        ConsumerWorker.for_models(make_config(*paths, core_algo="PPO", group_size=1, kl_coef=0.0), BigramLM())
