"""coati_relay.algorithms: hand-computed values for every estimator, loss and KL, by hand."""
from __future__ import annotations

import math

import pytest
import torch

from coati_relay import algorithms as alg

T = torch.tensor


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, T(expected, dtype=actual.dtype), rtol=1e-5, atol=atol)


# -------------------------------------------------------------------------------------------------- masked ops
X = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = T([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


def test_masked_sum_and_mean():
    close(alg.masked_sum(X, M, dim=1), [3.0, 4.0])
    close(alg.masked_sum(X, M), 7.0)
    close(alg.masked_mean(X, M, dim=1), [1.5, 4.0])
    close(alg.masked_mean(X, M), 7.0 / 3)
    close(alg.masked_mean(X, torch.zeros_like(M), dim=1), [0.0, 0.0])  # empty rows give 0, not NaN
    close(alg.masked_mean(T([[2.0], [4.0]]), M, dim=1), [2.0, 4.0])  # [B,1] broadcasts over the mask


def test_masked_mean_rejects_mismatched_mask():
    with pytest.raises(ValueError, match="does not broadcast"):
        alg.masked_mean(X, torch.ones(3, 2))


def test_whiten_uses_valid_entries_only():
    # valid entries 1, 2, 4: mean 7/3, population variance 14/9
    out = alg.whiten(X, M, eps=0.0)
    close(out, [[-1.0690450, -0.2672612, 0.0], [1.3363062, 0.0, 0.0]])
    close(alg.masked_mean(out, M), 0.0)
    close(alg.masked_var(out, M), 1.0, atol=1e-5)


# -------------------------------------------------------------------------------------------------- registry
def _inputs(rewards, group_size, **kw):
    n = rewards.numel()
    return alg.AdvantageInputs(rewards, group_size, torch.ones(n, 3), torch.zeros(n, 3), **kw)


def test_registry_lists_and_finds_every_kind():
    assert alg.names("advantage") == ["dapo", "grpo", "ppo", "reinforce_ppb", "rloo"]
    assert alg.names("kl") == ["k1", "k2", "k3"]
    assert alg.get("policy_loss", "ppo_clip") is alg.policy_loss
    assert alg.get("value_loss", "clipped") is alg.value_loss
    out = alg.get("advantage", "GRPO")(_inputs(T([1.0, 0.0]), 2), None)  # names are case-insensitive
    assert out.advantages.shape == (2, 1) and out.returns is None
    assert alg.spec("PPO").needs_critic and alg.spec("PPO").kl_weight_key == "kl_coef"
    assert alg.spec("DAPO").defaults == {} and alg.spec("rloo").min_group_size == 2  # ColossalChat's: GRPO's
    assert alg.spec("PPO").defaults == {"weight_decay": 0.0, "normalize_advantages": True,
                                     "lr_scheduler": "constant"}  # the extension's own


def test_registry_errors():
    with pytest.raises(ValueError, match=r"unknown advantage 'trpo'.*'grpo'"):
        alg.get("advantage", "trpo")
    with pytest.raises(ValueError, match="unknown algorithm kind 'reward'"):
        alg.get("reward", "x")
    with pytest.raises(ValueError, match="already registered"):
        alg.register("kl", "k3")(lambda logp, ref: logp)
    with pytest.raises(ValueError, match="needs spec=AlgorithmSpec"):
        alg.register("advantage", "no_spec")
    with pytest.raises(ValueError, match="only advantage estimators take a spec"):
        alg.register("kl", "k4", spec=alg.AlgorithmSpec())


def test_register_adds_a_new_name():
    def k0(logp, ref_logp):
        return torch.zeros_like(logp)

    alg.register("kl", "test_zero")(k0)
    try:
        close(alg.kl_estimate(T([[1.0]]), T([[2.0]]), kind="test_zero"), [[0.0]])
    finally:
        alg.unregister("kl", "test_zero")


# -------------------------------------------------------------------------------------------------- advantages
REWARDS = T([1.0, 0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0])  # two groups of G = 4


@pytest.mark.parametrize("algo,expected", [
    # group 1: mean 0.5, unbiased std sqrt(1/3); group 2: mean 5, unbiased std sqrt(20/3)
    ("grpo", [0.8658754, -0.8658754, -0.8658754, 0.8658754, -1.1618500, -0.3872833, 0.3872833, 1.1618500]),
    ("dapo", [0.8658754, -0.8658754, -0.8658754, 0.8658754, -1.1618500, -0.3872833, 0.3872833, 1.1618500]),
    ("rloo", [2 / 3, -2 / 3, -2 / 3, 2 / 3, -4.0, -4 / 3, 4 / 3, 4.0]),
    ("REINFORCE_PPB", [0.5, -0.5, -0.5, 0.5, -3.0, -1.0, 1.0, 3.0]),
])
def test_group_advantage(algo, expected):
    close(alg.group_advantage(REWARDS, 4, algo), expected)
    if algo != "REINFORCE_PPB":  # which whitens them (below)
        close(alg.get("advantage", algo)(_inputs(REWARDS, 4), None).advantages, [[e] for e in expected])


def test_reinforce_ppb_whitens_without_a_reference_model_too():
    params = type("P", (), {"beta": 0.5, "kl_estimator": "k3"})
    mask = T([[1.0, 1.0, 0.0]] * 4 + [[1.0, 1.0, 1.0]] * 4)
    out = alg.get("advantage", "reinforce_ppb")(alg.AdvantageInputs(REWARDS, 4, mask, torch.zeros(8, 3)), params)
    centred = T([0.5, -0.5, -0.5, 0.5, -3.0, -1.0, 1.0, 3.0]).unsqueeze(1).expand(8, 3)
    valid = centred[mask.bool()]  # the tokens: mean and population variance over them
    expected = (centred - valid.mean()) / torch.sqrt(valid.var(unbiased=False) + 1e-8) * mask
    torch.testing.assert_close(out.advantages, expected)
    assert out.advantages.shape == (8, 3)


def test_whitening_over_ranks_uses_the_statistics_of_the_whole_batch():
    """Rank 0 holds the first half of a batch; the all-reduce adds rank 1's sum, sum of squares and count."""
    x = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [0.5, 9.0, -2.0], [7.0, 1.0, 1.0]])
    mask = T([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]], dtype=torch.bool)
    other_valid = x[2:][mask[2:]]
    other = torch.tensor([other_valid.sum(), (other_valid ** 2).sum(), other_valid.numel()], dtype=torch.float64)
    got = alg.whiten_over_ranks(x[:2], mask[:2], all_reduce=lambda stats: stats + other)
    torch.testing.assert_close(got, alg.whiten(x, mask)[:2])
    assert not torch.allclose(got, alg.whiten(x[:2], mask[:2])), "the half's own statistics differ"


def test_reinforce_ppb_folds_the_kl_into_whitened_advantages():
    params = type("P", (), {"beta": 0.5, "kl_estimator": "k3"})
    ref = torch.full((8, 3), -1.0)  # behaviour log-probs are 0
    out = alg.get("advantage", "reinforce_ppb")(_inputs(REWARDS, 4, ref_logprobs=ref), params)
    k3 = math.exp(-1.0) - 1 + 1.0  # x = ref - logp = -1 on every token
    base = T([0.5, -0.5, -0.5, 0.5, -3.0, -1.0, 1.0, 3.0]).unsqueeze(1)
    torch.testing.assert_close(out.advantages, alg.whiten(base - 0.5 * k3 * torch.ones(8, 3), torch.ones(8, 3)))
    assert not alg.spec("reinforce_ppb").kl_in_loss


def test_ppo_estimator_is_token_rewards_then_gae():
    params = type("P", (), {"kl_coef": 0.1, "gamma": 1.0, "lam": 0.5, "normalize_advantages": False})
    rewards, mask = T([1.0, 2.0]), T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    logp, ref, values = torch.zeros(2, 3), torch.full((2, 3), -0.5), T([[0.5, 0.4, 0.3], [1.0, 0.5, 7.0]])
    out = alg.get("advantage", "ppo")(alg.AdvantageInputs(rewards, 1, mask, logp, ref, values), params)
    token_rewards = alg.token_level_rewards(rewards, logp, ref, mask, 0.1)
    adv, ret = alg.gae(token_rewards, values, mask, gamma=1.0, lam=0.5)
    torch.testing.assert_close(out.advantages, adv)
    torch.testing.assert_close(out.returns, ret)
    with pytest.raises(ValueError, match="critic's values"):
        alg.get("advantage", "ppo")(alg.AdvantageInputs(rewards, 1, mask, logp), params)


def test_rloo_is_leave_one_out_baseline():
    r = torch.randn(12, generator=torch.Generator().manual_seed(0))
    g = r.view(-1, 3)
    loo = g - (g.sum(1, keepdim=True) - g) / 2
    close(alg.group_advantage(r, 3, "rloo"), loo.flatten().tolist())


@pytest.mark.parametrize("algo", ["grpo", "dapo", "rloo"])
def test_group_of_one_is_an_error(algo):
    with pytest.raises(ValueError, match="group_size >= 2"):
        alg.group_advantage(T([1.0, 2.0]), 1, algo)


def test_group_advantage_input_errors():
    close(alg.group_advantage(T([1.0, 2.0]), 1, "reinforce_pp"), [0.0, 0.0])
    close(alg.group_advantage(T([1, 3]), 2, "rloo"), [-2.0, 2.0])  # integer rewards are promoted to float
    with pytest.raises(ValueError, match="multiple of group_size=4"):
        alg.group_advantage(T([1.0, 2.0, 3.0]), 4, "grpo")
    with pytest.raises(ValueError, match="unknown algo 'ppo'"):
        alg.group_advantage(REWARDS, 4, "ppo")
    with pytest.raises(ValueError, match="positive int"):
        alg.group_advantage(REWARDS, 0, "grpo")


def test_gae_by_hand():
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    values = T([[0.5, 0.4, 0.3], [1.0, 0.5, 7.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    # gamma 1, lam 0.5. Row 0: deltas (-0.1, -0.1, 0.7) -> A2 = 0.7, A1 = -0.1 + 0.35 = 0.25, A0 = -0.1 + 0.125.
    # Row 1: last valid t = 1: delta 2 - 0.5 = 1.5; t = 0: delta 0.5 - 1 = -0.5 -> A0 = -0.5 + 0.75.
    adv, ret = alg.gae(rewards, values, mask, gamma=1.0, lam=0.5)
    close(adv, [[0.025, 0.25, 0.7], [0.25, 1.5, 0.0]])
    close(ret, [[0.525, 0.65, 1.0], [1.25, 2.0, 0.0]])
    # gamma 0.5, lam 1: returns are the discounted returns 0.25, 0.5, 1
    adv, ret = alg.gae(rewards[:1], values[:1], mask[:1], gamma=0.5, lam=1.0)
    close(adv, [[-0.25, 0.1, 0.7]])
    close(ret, [[0.25, 0.5, 1.0]])


def test_gae_skips_holes_in_the_mask():
    rewards, values = T([[0.0, 5.0, 1.0]]), T([[0.5, 3.0, 0.3]])
    adv, ret = alg.gae(rewards, values, T([[1, 0, 1]]), gamma=1.0, lam=0.5)
    # t=2: 0.7; t=0 links straight to t=2: delta = 0 + 0.3 - 0.5 = -0.2, A0 = -0.2 + 0.35
    close(adv, [[0.15, 0.0, 0.7]])
    with pytest.raises(ValueError, match=r"\[B,T\]"):
        alg.gae(rewards, values, T([1, 1, 1]))


def test_kl_estimators_by_hand():
    logp, ref = T([[-1.0, -2.0]]), T([[-1.5, -1.0]])  # x = ref - logp = (-0.5, 1)
    close(alg.kl_estimate(logp, ref, "k1"), [[0.5, -1.0]])
    close(alg.kl_estimate(logp, ref, "k2"), [[0.125, 0.5]])
    close(alg.kl_estimate(logp, ref), [[math.exp(-0.5) - 0.5, math.e - 2]])
    close(alg.kl_estimate(logp, logp), [[0.0, 0.0]])
    with pytest.raises(ValueError, match="unknown kl 'k4'"):
        alg.kl_estimate(logp, ref, "k4")
    with pytest.raises(ValueError, match="one shape"):
        alg.kl_k3(logp, ref[:, :1])


LOGP = T([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
REF = T([[-1.5, -1.0, -3.0], [-0.5, -1.5, -9.0]])
AMASK = T([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def test_token_level_rewards_by_hand():
    # -0.1 * k1 with k1 = logp - ref: row 0 (0.5, -1, 0), row 1 (0, 1, masked); r at the last valid token
    out = alg.token_level_rewards(T([1.0, 2.0]), LOGP, REF, AMASK, kl_coef=0.1)
    close(out, [[-0.05, 0.1, 1.0], [0.0, 1.9, 0.0]])
    with pytest.raises(ValueError, match=r"rows \[1\] have no valid token"):
        alg.token_level_rewards(T([1.0, 2.0]), LOGP, REF, T([[1, 0, 0], [0, 0, 0]]), kl_coef=0.1)


# -------------------------------------------------------------------------------------------------- losses
P_LOGP = T([[-1.0, -0.5, -2.0], [-1.2, -0.3, -0.7]])
P_OLD = T([[-1.1, -0.9, -2.0], [-1.0, -0.3, -0.1]])  # log-ratios (0.1, 0.4, 0), (-0.2, 0, -0.6)
P_ADV = T([[1.0], [-2.0]])
P_MASK = T([[1, 1, 0], [1, 1, 1]])


def test_policy_loss_by_hand():
    # row 0 (A=1): -min(r, clip(r)) = (-1.1051709, -1.2), mean -1.1525855
    # row 1 (A=-2): (1.6374615, 2.0, 1.6), mean 1.7458205
    loss, stats = alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK)
    close(loss, 0.2966175)
    assert stats["clip_frac"] == pytest.approx(0.4)  # (0,1) and (1,2) are clipped, 2 of 5 valid tokens
    assert stats["ratio_max"] == pytest.approx(math.exp(0.4))
    assert stats["loss"] == pytest.approx(loss.item())
    assert stats["approx_kl"] > 0 and "kl" not in stats
    token, _ = alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, aggregation="token_level")
    close(token, (-1.1051709 - 1.2 + 1.6374615 + 2.0 + 1.6) / 5)
    # asymmetric clip: eps_high 0.5 leaves ratio e^0.4 = 1.4918 unclipped in row 0
    asym, _ = alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, clip_eps_high=0.5)
    close(asym, 0.2236613)


def test_policy_loss_kl_term_and_loss_mask():
    kl = T([[0.2, 0.4, 9.0], [0.0, 0.3, 0.6]])
    base, _ = alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK)
    with_kl, stats = alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, per_token_kl=kl, beta=0.5)
    close(with_kl, base.item() + 0.5 * (0.3 + 0.3) / 2)  # per-sample KL means 0.3 and 0.3
    assert stats["kl"] == pytest.approx(1.5 / 5)
    masked, _ = alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, loss_mask=T([0.0, 1.0]))
    close(masked, 1.7458205 / 2)  # dropped samples are not renormalised
    token, _ = alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, aggregation="token_level", loss_mask=T([0.0, 1.0]))
    close(token, 5.2374615 / 3)
    token, _ = alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, aggregation="token_level", total_tokens=10)
    close(token, 2.9322906 / 10)
    # counts of a whole batch split over micro-batches or ranks: the kept samples divide the sum
    whole, _ = alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, loss_mask=T([0.0, 1.0]), num_samples=4)
    close(whole, 1.7458205 / 4)


def test_policy_loss_gradient_flows_only_through_logp():
    logp = P_LOGP.clone().requires_grad_(True)
    old = P_OLD.clone().requires_grad_(True)
    loss, _ = alg.policy_loss(logp, old, P_ADV, P_MASK)
    loss.backward()
    assert old.grad is None
    assert logp.grad[0, 2] == 0 and logp.grad[0, 0] != 0  # masked tokens get no gradient


def test_policy_loss_input_errors():
    with pytest.raises(ValueError, match="aggregation"):
        alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, aggregation="seq_mean")
    with pytest.raises(ValueError, match="beta > 0 needs per_token_kl"):
        alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, beta=0.1)
    with pytest.raises(ValueError, match="advantages"):
        alg.policy_loss(P_LOGP, P_OLD, T([[1.0, 2.0]]), P_MASK)
    with pytest.raises(ValueError, match="loss_mask"):
        alg.policy_loss(P_LOGP, P_OLD, P_ADV, P_MASK, loss_mask=T([1.0]))


def legacy_policy_loss(log_probs, old_log_probs, advantages, action_mask, clip_eps=0.2):
    """Direct transcription of the legacy PolicyLoss math (legacy_spec §A.4)."""
    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages
    loss = -torch.min(surr1, surr2)
    loss = (loss * action_mask).sum(dim=1) / (action_mask.sum(dim=1) + 1e-8)
    return loss.mean()


def legacy_value_loss(values, old_values, reward, clip_eps=0.4):
    values_clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    surr1 = (values_clipped - reward) ** 2
    surr2 = (values - reward) ** 2
    return 0.5 * torch.max(surr1, surr2).mean()


@pytest.mark.parametrize("seed,b,a", [(0, 4, 7), (1, 1, 1), (2, 16, 33)])
def test_policy_loss_equals_legacy_exactly(seed, b, a):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, a, generator=g) * 3
    old = logp + torch.randn(b, a, generator=g) * 0.3
    adv = torch.randn(b, 1, generator=g)
    mask = torch.rand(b, a, generator=g) > 0.3
    mask[:, 0] = True
    ours, _ = alg.policy_loss(logp, old, adv, mask)
    assert torch.equal(ours, legacy_policy_loss(logp, old, adv, mask))


@pytest.mark.parametrize("seed,b", [(0, 4), (1, 1), (2, 64)])
def test_value_loss_equals_legacy_exactly(seed, b):
    g = torch.Generator().manual_seed(seed)
    v, old, r = (torch.randn(b, generator=g) for _ in range(3))
    assert torch.equal(alg.value_loss(v, old, r), legacy_value_loss(v, old, r))


def test_value_loss_by_hand():
    # v_clip = (0.9, 0.0); max((v_clip-R)^2, (v-R)^2) = (1.21, 1.0)
    v, old, ret = T([1.0, 0.0]), T([0.5, 0.2]), T([2.0, -1.0])
    close(alg.get("value_loss", "clipped")(v, old, ret), 0.5525)
    close(alg.value_loss(v, old, ret, mask=T([1, 0])), 0.605)
    close(alg.value_loss(v, old, ret, mask=T([1, 0]), total_tokens=4), 0.605 / 4)
    with pytest.raises(ValueError, match="pass the mask"):
        alg.value_loss(v, old, ret, total_tokens=4)
    close(alg.value_loss(v, old, ret, clip_eps=1.0), 0.5 * (1.0 + 1.0) / 2)
    with pytest.raises(ValueError, match="one shape"):
        alg.value_loss(v, old, ret[:1])


@pytest.mark.parametrize("aggregation", ["sample_level", "token_level"])
def test_an_infinite_log_ratio_on_a_dropped_sample_leaves_loss_and_gradient_finite(aggregation):
    """A -inf behaviour log-prob on a sample the loss mask drops: exp(inf) * 0 would be NaN, and the gradient
    all-reduce would spread it to every rank. The log-ratio is clamped to [-20, 20] before the exp."""
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    old = torch.full((2, 3), -1.0)
    old[1, 0] = float("-inf")
    loss, stats = alg.policy_loss(logp, old, T([[1.0], [-1.0]]), torch.ones(2, 3), aggregation=aggregation,
                                  loss_mask=T([1.0, 0.0]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all(), (loss, logp.grad)
    assert stats["ratio_max"] == pytest.approx(math.exp(20.0), rel=1e-5)
    torch.testing.assert_close(logp.grad[1], torch.zeros(3))


def test_register_estimator_from_the_top_level_makes_a_core_algo():
    import coati_relay
    from coati_relay.algorithms import Advantages, names, unregister
    from coati_relay.config.algorithm import core_algos

    @coati_relay.register_estimator("centred_test")
    def centred(inputs, params):
        return Advantages((inputs.rewards - inputs.rewards.mean()).unsqueeze(1))

    try:
        assert "centred_test" in names("advantage") and "CENTRED_TEST" in core_algos()
        assert "register_estimator" in dir(coati_relay)
    finally:
        unregister("advantage", "centred_test")
