"""The rewriter carries a training step that trains an actor and a critic (legacy_actor_critic_learner.py): the
actor's loss becomes a policy loss, the critic's a value loss, both registered under the class's name, on PPO."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch

from coati_compat.migrate import migrate_file, migrate_source
from coati_compat.migrate.cli import EXIT_OK, main

FIXTURE = Path(__file__).resolve().parent / "legacy_actor_critic_learner.py"


@pytest.fixture(scope="module")
def migrated():
    return migrate_file(FIXTURE)


@pytest.fixture(scope="module")
def namespace(migrated):
    ns = {"__name__": "migrated_actor_critic"}
    exec(compile(migrated.script, "migrated actor critic", "exec"), ns)  # noqa: S102
    return ns


def legacy_critic_loss(values, old_values, reward):
    """The fixture's critic loss as the legacy step computed it (plain means over its tensors)."""
    err = values - reward
    huber = torch.where(err.abs() < 1.0, 0.5 * err ** 2, err.abs() - 0.5)
    return 0.5 * huber.mean() + 0.1 * ((values - old_values) ** 2).mean()


def test_migrates_completely_with_both_losses_named_after_the_class(migrated, tmp_path):
    assert main([str(FIXTURE), "-o", str(tmp_path)]) == EXIT_OK
    assert migrated.complete and "NOT TRANSLATED" not in migrated.script
    kw = migrated.launch_kwargs({"model_path": "m", "prompt_path": "p.csv"})
    assert kw["core_algo"] == "PPO" and kw["critic_model_config"] == {"path": "m"}
    grpo = kw["grpo_config"]
    assert (grpo["policy_loss"], grpo["value_loss"]) == ("HuberActorCritic", "HuberActorCritic")
    assert (grpo["lr_scheduler"], grpo["weight_decay"]) == ("constant", 0.0)
    assert 'register("policy_loss", "HuberActorCritic")(huber_actor_critic_loss)' in migrated.script
    assert 'register("value_loss", "HuberActorCritic")(huber_actor_critic_value_loss)' in migrated.script


def test_the_value_loss_is_the_legacy_formula_with_its_gradient(namespace):
    """Per sequence as the legacy critic gave ([B,1], every entry valid): equal to the legacy loss, gradient too."""
    fn = namespace["huber_actor_critic_value_loss"]
    g = torch.Generator().manual_seed(1)
    values = (2 * torch.randn(6, 1, generator=g)).requires_grad_()
    old, reward = torch.randn(6, 1, generator=g), 2 * torch.randn(6, 1, generator=g)
    expected = legacy_critic_loss(values, old, reward)
    (want,) = torch.autograd.grad(expected, values)
    got = fn(values, old, reward, clip_eps=0.4, mask=torch.ones(6, 1), total_tokens=6.0)
    (got_grad,) = torch.autograd.grad(got, values)
    assert (reward - values).abs().min() < 1 < (reward - values).abs().max(), "both branches of the Huber loss"
    assert got.item() == pytest.approx(expected.item(), abs=1e-6) and expected.item() > 1e-3
    torch.testing.assert_close(got_grad, want, atol=1e-6, rtol=0)


def test_the_value_loss_over_micro_batches_is_the_masked_token_mean(namespace):
    """Per token ([B,T] with a mask), called on two micro-batches as the learner does (total_tokens: the step's), the
    parts add up to the legacy formula over the valid tokens, and so do their gradients."""
    fn = namespace["huber_actor_critic_value_loss"]
    g = torch.Generator().manual_seed(2)
    values = (2 * torch.randn(6, 5, generator=g)).requires_grad_()
    old, returns = torch.randn(6, 5, generator=g), 2 * torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    keep = mask.bool()
    expected = legacy_critic_loss(values[keep], old[keep], returns[keep])
    (want,) = torch.autograd.grad(expected, values)
    total = sum(fn(values[s], old[s], returns[s], clip_eps=0.4, mask=mask[s], total_tokens=mask.sum())
                for s in (slice(0, 2), slice(2, 6)))
    (got,) = torch.autograd.grad(total, values)
    assert total.item() == pytest.approx(expected.item(), abs=1e-6)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_the_policy_loss_keeps_only_the_actors_statements(namespace):
    fn = namespace["huber_actor_critic_loss"]
    g = torch.Generator().manual_seed(3)
    logp = torch.randn(4, 5, generator=g).requires_grad_()
    old, adv = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    mask = torch.ones(4, 5)
    loss, _ = fn(logp, old, adv, mask, num_samples=4.0)
    ratio, mean_adv = (logp - old).exp().mean(1), adv.mean(1)
    assert loss.item() == pytest.approx(-(ratio * mean_adv).mean().item(), rel=1e-6)


def test_every_adapted_line_has_a_note(migrated):
    """Each line of the fixture's training_step that changed or went away is named in a NOTE of one of the losses;
    the critic's metric is the engine's value_loss."""
    script = migrated.script
    policy = script[script.index("def huber_actor_critic_loss"):script.index("def huber_actor_critic_value_loss")]
    value = script[script.index("def huber_actor_critic_value_loss"):script.index("def build_parser")]
    for line in (27, 28, 29, 30, 31, 32, 33, 34, 43):
        assert f"(line {line})" in policy, line
    for line in (35, 37, 39, 40, 41, 42):
        assert f"(line {line})" in value, line
    for body in (policy, value):
        code = [line for line in body.splitlines() if not line.lstrip().startswith("#")]
        assert not any("backward(" in line or "optim." in line or "self." in line for line in code)
    policy_code = [line.strip() for line in policy.splitlines() if not line.lstrip().startswith("#")]
    assert not any(line.startswith(("err =", "huber =", "critic_loss =")) for line in policy_code)
    joined = re.sub(r"\s*\n\s*#\s*", " ", policy)
    assert "critic_loss as 'value_loss'" in joined


def test_a_critic_loss_reading_what_a_value_loss_does_not_get_stays_not_translated():
    source = textwrap.dedent('''
        import ray
        from coati.ray.detached_trainer_base import DetachedTrainer


        class Both(DetachedTrainer):
            def training_step(self, experience):
                logp = self.actor(experience.sequences, 3)
                loss = -(experience.advantages * logp).mean()
                loss.backward()
                values = self.critic(experience.sequences)
                vloss = ((values - experience.advantages) ** 2).mean()
                vloss.backward()
                return {"loss": loss.item()}


        trainer = Both.options(name="t").remote(experience_maker_holder_name_list=["m"])
    ''')
    m = migrate_source(source, "both.py")
    (text,) = [u for u in m.untranslated if "Both" in u]
    assert "critic loss reads what a value loss does not get: experience.advantages" in text
