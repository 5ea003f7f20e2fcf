"""Level 2: a fixed set of rollouts replayed through the reference legacy PPO step and the shim's
``DetachedPPOTrainer`` implementation; per-step losses and the final weights agree (fp32, CPU).
"""
from __future__ import annotations

import copy

import pytest
import torch

from coati_compat.legacy.callbacks import TrainerCallback
from coati_compat.legacy.experience import Experience
from coati_compat.legacy.model_families import LlamaActor, LlamaCritic
from coati_compat.legacy.strategies import NaiveStrategy
from coati_compat.reference.experience import FIELDS, action_log_probs
from coati_compat.reference.training import ppo_training_step
from coati_compat.shims.ppo_trainer import DetachedPPOTrainerImpl
from coati_compat.shims.replay_buffer import DetachedReplayBuffer
from coati_relay.toy import tiny_config

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

STEPS, BATCH, PROMPT, ACTIONS, EOS, PAD = 24, 4, 8, 8, 1, 0
RTOL, ATOL = 1e-5, 1e-6
# Weights: the shim steps torch's fused Adam (the engine's optimizer, `plugins.optimizer_kind`), the reference the
# unfused one; they round apart by about 1e-7 a step, which Adam's division by each element's running RMS carries to
# at most 1.7e-6 over these steps (weights of about 0.09).
WEIGHT_ATOL = 5e-6


def models():
    torch.manual_seed(0)
    cfg = tiny_config("llama")
    return LlamaActor(config=cfg), LlamaCritic(config=cfg, use_action_mask=True)


@torch.no_grad()
def fixed_rollouts(actor_hf: torch.nn.Module, n: int, seed: int = 1):
    """n batches shaped like the legacy maker's: left-padded prompts, responses ending at an EOS (then padding),
    behaviour log-probs near the current policy's, a KL-shaped reward and ``advantage = reward - value``."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        seq = torch.randint(2, 300, (BATCH, PROMPT + ACTIONS), generator=g)
        pad_left = torch.randint(0, 3, (BATCH,), generator=g)
        positions = torch.arange(PROMPT + ACTIONS)
        seq[positions[None, :] < pad_left[:, None]] = PAD
        eos_at = torch.randint(2, ACTIONS + 2, (BATCH,), generator=g)  # >= ACTIONS: no EOS in the response
        response = positions[None, :ACTIONS]
        seq[:, PROMPT:][response == eos_at[:, None]] = EOS
        seq[:, PROMPT:][response > eos_at[:, None]] = PAD
        attention_mask = (seq != PAD).long()
        action_mask = response <= eos_at[:, None]
        logp = action_log_probs(actor_hf, seq, ACTIONS, attention_mask)
        old_logp = logp + 0.3 * torch.randn(logp.shape, generator=g)
        values = torch.randn(BATCH, generator=g)
        reward = torch.randn(BATCH, generator=g)
        batches.append(Experience(seq, old_logp, values, reward, (reward - values)[:, None], attention_mask,
                                  action_mask))
    return batches


def as_batch(exp: Experience):
    return {k: getattr(exp, k).clone() for k in FIELDS}


class Reference:
    """The reference step on deep copies of the shim trainer's initial modules, with its own optimizers."""

    def __init__(self, trainer: DetachedPPOTrainerImpl, actor_lr: float, critic_lr: float) -> None:
        self.actor = copy.deepcopy(trainer.actor.model)
        self.body = copy.deepcopy(trainer.critic.model)
        self.head = copy.deepcopy(trainer.critic.value_head)
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=actor_lr)
        self.critic_optim = torch.optim.Adam(list(self.body.parameters()) + list(self.head.parameters()),
                                             lr=critic_lr)

    def step(self, exp: Experience):
        return ppo_training_step(self.actor, self.body, self.head, self.actor_optim, self.critic_optim,
                                 as_batch(exp))

    def assert_same_weights(self, trainer: DetachedPPOTrainerImpl) -> None:
        for ref, shim in ((self.actor, trainer.actor.model), (self.body, trainer.critic.model),
                          (self.head, trainer.critic.value_head)):
            for (name, a), (_, b) in zip(ref.state_dict().items(), shim.state_dict().items()):
                torch.testing.assert_close(b, a, rtol=RTOL, atol=WEIGHT_ATOL, msg=name)


def assert_losses_agree(shim_losses, ref_losses):
    assert len(shim_losses) == len(ref_losses) >= 20
    for step, (s, r) in enumerate(zip(shim_losses, ref_losses)):
        for key in ("actor_loss", "critic_loss"):
            assert s[key] == pytest.approx(r[key], rel=RTOL, abs=ATOL), f"step {step} {key}"


@pytest.mark.parametrize("actor_lr,critic_lr", [(1e-7, 1e-7), (1e-3, 3e-4)])
def test_training_steps_agree_with_the_reference(actor_lr, critic_lr):
    kwargs = {} if actor_lr == 1e-7 else {"actor_lr": actor_lr, "critic_lr": critic_lr}
    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, models, train_batch_size=BATCH, **kwargs)
    ref = Reference(trainer, actor_lr, critic_lr)
    rollouts = fixed_rollouts(ref.actor, STEPS)
    shim_losses, ref_losses = [], []
    for exp in rollouts:
        ref_losses.append(ref.step(exp))
        shim_losses.append(trainer.training_step(copy.deepcopy(exp)))
    assert_losses_agree(shim_losses, ref_losses)
    ref.assert_same_weights(trainer)
    moved = trainer.actor.model.model.embed_tokens.weight - models()[0].model.model.embed_tokens.weight
    assert moved.abs().max() > 0  # the steps did train


class StepLog(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_batch_end(self, metrics, experience):
        self.steps.append((metrics, experience.sequences.clone()))


@pytest.mark.parametrize("update_steps,train_epochs", [(4, 1), (3, 2)])
def test_fit_replays_the_same_batches_as_the_reference(update_steps, train_epochs):
    """Through the buffer and the legacy fit loop (replay epochs included): the reference trains the batches in the
    order the shim did and ends with the same losses and weights."""
    log = StepLog()
    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, models, train_batch_size=BATCH, callbacks=[log],
                                     actor_lr=1e-3, critic_lr=3e-4)
    trainer.detached_replay_buffer = DetachedReplayBuffer(BATCH)
    ref = Reference(trainer, 1e-3, 3e-4)
    episodes = 24 // (update_steps * train_epochs)
    rollouts = fixed_rollouts(ref.actor, episodes * update_steps)
    for exp in rollouts:
        trainer.buffer_append(copy.deepcopy(exp))
    torch.manual_seed(5)
    trainer.fit(episodes * update_steps, update_steps, train_epochs)
    ref_losses = []
    for _, sequences in log.steps:
        index = next(i for i, exp in enumerate(rollouts) if torch.equal(exp.sequences, sequences))
        ref_losses.append(ref.step(rollouts[index]))
    assert_losses_agree([m for m, _ in log.steps], ref_losses)
    ref.assert_same_weights(trainer)
