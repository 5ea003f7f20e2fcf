"""The learner's policy loss, value loss and KL estimator are the functions registered under the names the algorithm
settings give (``grpo_config``: ``policy_loss``, ``value_loss``, ``kl_estimator``), looked up where the step uses
them: a user's registered loss is what `ConsumerWorker.train_round` calls, each KL estimator gives its hand-computed
value and gradient, and a name nobody registered is refused in the driver (the slow runs in real placements:
tests/e2e/test_user_loss_runs.py)."""
from __future__ import annotations

import math

import pytest
import torch
from train_round_helpers import BigramLM, TokenCritic, make_config, make_rollout, record_steps

from coati_relay import algorithms as alg
from coati_relay.assembly.build import ConfigError
from coati_relay.roles.consumer import ConsumerWorker
from coati_relay.roles.logprobs import response_logprobs

PROMPTS = [[3, 4, 5], [6], [7, 8], [9, 10]]
RESPONSES = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [2, 2], [3, 11, 4], [5], [6, 7, 8]]
REWARDS = [1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 1.0, 0.2]


@pytest.fixture(scope="module")
def paths(tiny_model_path, tmp_path_factory):
    from coati_relay.toy import write_toy_dataset

    return tiny_model_path, str(write_toy_dataset(tmp_path_factory.mktemp("data") / "p.jsonl", num_prompts=16))


@pytest.fixture
def doubled():
    """A user's policy loss and value loss: twice the built-in ones, registered for the test's duration."""
    calls = {"policy_loss": 0, "value_loss": 0}

    @alg.register("policy_loss", "test_doubled")
    def doubled_policy_loss(logp, old_logp, advantages, mask, **options):
        calls["policy_loss"] += 1
        loss, stats = alg.policy_loss(logp, old_logp, advantages, mask, **options)
        return 2 * loss, stats

    @alg.register("value_loss", "test_doubled")
    def doubled_value_loss(values, old_values, returns, clip_eps, mask, total_tokens):
        calls["value_loss"] += 1
        return 2 * alg.value_loss(values, old_values, returns, clip_eps=clip_eps, mask=mask,
                                  total_tokens=total_tokens)

    yield calls
    alg.unregister("policy_loss", "test_doubled")
    alg.unregister("value_loss", "test_doubled")


def _record_critic_steps(worker) -> list:
    grads = []
    step = worker.critic.step

    def recording_step():
        grads.append(worker.critic.unwrapped().value.grad.detach().clone())
        return step()

    worker.critic.step = recording_step
    return grads


def test_a_registered_policy_loss_named_in_grpo_config_is_what_the_learner_calls(paths, doubled):
    """Off-policy rows (clipping active), a KL term, two micro-batches: the user's loss (twice the built-in) gives
    twice the built-in's gradient and logged loss."""
    rollout = make_rollout(PROMPTS, RESPONSES, 2, REWARDS, policy=BigramLM(), logprob_shift=0.5)
    found = {}
    for name in ("ppo_clip", "test_doubled"):
        cfg = make_config(*paths, train_batch_size=4, microbatch=4, beta=0.2, policy_loss=name)
        worker = ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1))
        grads = record_steps(worker)
        stats = worker.train_round(rollout)
        found[name] = (grads[0]["table"], stats)
    assert doubled["policy_loss"] == 2, "one call per micro-batch"
    (base, base_stats), (user, user_stats) = found["ppo_clip"], found["test_doubled"]
    assert base.abs().max() > 1e-3, "a gradient of zero would prove nothing"
    torch.testing.assert_close(user, 2 * base, rtol=1e-5, atol=1e-7)
    assert user_stats["loss"] == pytest.approx(2 * base_stats["loss"], rel=1e-5)
    assert user_stats["clip_frac"] == pytest.approx(base_stats["clip_frac"]) and base_stats["clip_frac"] > 0


def test_a_registered_value_loss_is_what_the_critic_learns_with(paths, doubled):
    rollout = make_rollout(PROMPTS + [[2], [3], [4], [5]], RESPONSES, 1, REWARDS, policy=BigramLM())
    found = {}
    for name in ("clipped", "test_doubled"):
        cfg = make_config(*paths, core_algo="PPO", group_size=1, train_batch_size=8, kl_coef=0.0, value_loss=name)
        worker = ConsumerWorker.for_models(cfg, BigramLM(), critic=TokenCritic())
        grads = _record_critic_steps(worker)
        stats = worker.train_round(rollout)
        found[name] = (grads[0], stats["value_loss"])
    assert doubled["value_loss"] >= 1
    assert found["clipped"][0].abs().max() > 1e-3
    torch.testing.assert_close(found["test_doubled"][0], 2 * found["clipped"][0], rtol=1e-5, atol=1e-7)
    assert found["test_doubled"][1] == pytest.approx(2 * found["clipped"][1], rel=1e-5)


# -- the KL estimator ------------------------------------------------------------------------------------------------
def test_each_kl_estimator_gives_its_hand_computed_value():
    """logp = log 0.5, ref_logp = log 0.25 (so x = ref_logp - logp = -log 2): k1 = log 2, k2 = (log 2)^2 / 2,
    k3 = 1/2 - 1 + log 2."""
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    hand = {"k1": 0.693147, "k2": 0.240227, "k3": 0.193147}
    for name, value in hand.items():
        assert alg.get("kl", name)(logp, ref).item() == pytest.approx(value, abs=1e-6), name


HAND_KL = {"k1": lambda x: -x, "k2": lambda x: x ** 2 / 2, "k3": lambda x: x.exp() - 1 - x}


@pytest.mark.parametrize("name", sorted(HAND_KL))
def test_the_selected_kl_estimator_is_the_kl_of_the_loss(paths, name):
    """Equal rewards in every group: A = 0, so the whole gradient is that of beta * mean_b masked_mean_t KL with the
    selected estimator written out here (x = ref_logp - logp); the logged KL is its masked mean over all tokens."""
    beta = 0.5
    cfg = make_config(*paths, train_batch_size=4, microbatch=8, beta=beta, kl_estimator=name.upper())
    rollout = make_rollout(PROMPTS, RESPONSES, 2, [1.0, 1.0, 0.0, 0.0, 0.3, 0.3, 1.0, 1.0], policy=BigramLM())
    worker = ConsumerWorker.for_models(cfg, BigramLM(), reference=BigramLM(seed=1))
    grads = record_steps(worker)
    stats = worker.train_round(rollout)

    width = rollout.response_ids.size(1)
    ref = response_logprobs(BigramLM(seed=1), rollout.sequences, rollout.attention_mask, width).detach()
    mask = rollout.response_mask.float()
    model = BigramLM()
    kl = HAND_KL[name](ref - response_logprobs(model, rollout.sequences, rollout.attention_mask, width))
    (beta * ((kl * mask).sum(1) / mask.sum(1)).mean()).backward()
    assert model.table.grad.abs().max() > 1e-3
    torch.testing.assert_close(grads[0]["table"], model.table.grad, rtol=1e-5, atol=1e-7)
    assert stats["kl"] == pytest.approx(float((kl * mask).sum() / mask.sum()), rel=1e-5)


def test_reinforce_pp_folds_the_selected_kl_into_its_advantages():
    logp, ref = torch.tensor([[-1.0, -2.0]] * 4), torch.tensor([[-0.5, -3.0]] * 4)
    mask = torch.ones(4, 2)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])
    out = {}
    for name in ("k1", "k3"):
        params = type("P", (), {"beta": 0.5, "kl_estimator": name})
        out[name] = alg.get("advantage", "reinforce_ppb")(alg.AdvantageInputs(rewards, 2, mask, logp, ref), params)
    base = alg.group_advantage(rewards, 2, "reinforce_pp").unsqueeze(1)
    expected = alg.whiten(base - 0.5 * (logp - ref), mask)  # k1 = logp - ref_logp, written out
    torch.testing.assert_close(out["k1"].advantages, expected * mask)
    assert not torch.allclose(out["k1"].advantages, out["k3"].advantages)


# -- the driver's checks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,value,words", [
    ("policy_loss", "ppo_clipp", ["grpo_config['policy_loss']", "['ppo_clip', 'test_doubled']",
                                  "did you mean 'ppo_clip'", "@register('policy_loss'"]),
    ("value_loss", "huber", ["grpo_config['value_loss']", "['clipped', 'test_doubled']"]),
    ("kl_estimator", "k4", ["grpo_config['kl_estimator']", "['k1', 'k2', 'k3']", "'k4'"]),
    ("kl_estimator", 3, ["grpo_config['kl_estimator']", "['k1', 'k2', 'k3']"]),
])
def test_a_name_nobody_registered_is_refused_before_any_actor_starts(paths, doubled, key, value, words):
    """The message lists what is registered, the user's own included; Ray was not started for it."""
    import ray

    from coati_relay import launch_distributed

    was = ray.is_initialized()
    with pytest.raises(ConfigError) as err:
        launch_distributed(**_launch_kwargs(*paths, **{key: value}))
    assert ray.is_initialized() == was
    for w in words:
        assert w in str(err.value), f"{w!r} not in {str(err.value)!r}"


def _launch_kwargs(model, data, **grpo):
    return dict(num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
                inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
                train_dataset_config={"path": data, "max_length": 32, "system_prompt": ""},
                inference_model_config={"path": model},
                train_model_config={"path": model},
                generate_config={"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0},
                grpo_config={"reward_fn_type": "toy_letter", **grpo}, plugin_config={}, num_generations=2,
                inference_backend="transformers", core_algo="GRPO", progress=False)


def test_defaults_are_the_built_ins_and_user_functions_are_shipped(paths, doubled):
    from coati_relay.assembly.build import build_run_config

    cfg = build_run_config(**_launch_kwargs(*paths))
    assert (cfg.algo.policy_loss, cfg.algo.value_loss, cfg.algo.kl_estimator) == ("ppo_clip", "clipped", "k3")
    assert cfg.user_code.entries == (), "the built-ins come with the engine"
    cfg = build_run_config(**_launch_kwargs(*paths, policy_loss="TEST_DOUBLED", kl_estimator="k2"))
    assert [(e.kind, e.name) for e in cfg.user_code.entries] == [("policy_loss", "test_doubled")]
