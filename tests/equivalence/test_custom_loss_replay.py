"""The custom policy-gradient trainer of examples/legacy/custom_trainer.py, replayed: its own ``training_step`` (the
legacy source, run on the reference actor) and the policy loss the rewriter carried out of it (the migrated
script's, called as the engine's learner calls it: on the engine's log-probs, per micro-batch, the losses added up,
then one optimizer step) train the same rollouts to the same per-step losses and final weights (fp32, CPU).

The rollouts have no left padding: the engine counts position ids over real tokens only, the legacy actor did not
(a documented difference of the log-probs themselves, not of the loss).
"""
from __future__ import annotations

import ast
import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from coati_compat.legacy.experience import Experience
from coati_compat.migrate import migrate_file
from coati_compat.reference.experience import action_log_probs
from coati_compat.reference.losses import masked_mean
from coati_relay.roles.logprobs import response_logprobs
from coati_relay.toy import build_tokenizer, tiny_config

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

LEGACY = Path(__file__).resolve().parents[2] / "examples" / "legacy" / "custom_trainer.py"
STEPS, BATCH, PROMPT, ACTIONS, EOS, PAD, LR = 20, 4, 8, 8, 1, 0, 1e-3
RTOL, ATOL = 1e-5, 1e-6
# Weights after 20 Adam steps: Adam divides each gradient element by its running RMS, so an element whose gradient is
# near zero turns the last bits of a micro-batch sum into up to ~lr/100 of a step.
WEIGHT_ATOL = 5e-5


def legacy_training_step():
    """``DetachedPGTrainer.training_step`` from the legacy script's source, as a plain function of (self, exp)."""
    tree = ast.parse(LEGACY.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DetachedPGTrainer")
    fn = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "training_step")
    fn.decorator_list = []
    namespace = {"masked_mean": masked_mean, "torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(LEGACY), "exec"), namespace)  # noqa: S102
    return namespace["training_step"]


def carried_loss():
    """The migrated script's policy loss (the function main() registers as 'DetachedPGTrainer')."""
    namespace = {"__name__": "migrated_custom_trainer"}
    exec(compile(migrate_file(LEGACY).script, "migrated custom_trainer.py", "exec"), namespace)  # noqa: S102
    return namespace["detached_pg_trainer_loss"]


@torch.no_grad()
def rollouts(model: torch.nn.Module, n: int, seed: int = 3):
    """n legacy experience batches: full-length prompts, responses ending at an EOS then padding, behaviour
    log-probs near the policy's, ``advantage = reward - value`` [B,1]."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seq = torch.randint(2, 300, (BATCH, PROMPT + ACTIONS), generator=g)
        eos_at = torch.randint(1, ACTIONS + 2, (BATCH,), generator=g)
        response = torch.arange(ACTIONS)[None, :]
        seq[:, PROMPT:][response == eos_at[:, None]] = EOS
        seq[:, PROMPT:][response > eos_at[:, None]] = PAD
        attention_mask = torch.ones_like(seq)
        attention_mask[:, PROMPT:][response > eos_at[:, None]] = 0
        action_mask = response.expand(BATCH, -1) <= eos_at[:, None]
        old = action_log_probs(model, seq, ACTIONS, attention_mask) + 0.2 * torch.randn(BATCH, ACTIONS, generator=g)
        values, reward = torch.randn(BATCH, generator=g), torch.randn(BATCH, generator=g)
        out.append(Experience(seq, old, values, reward, (reward - values)[:, None], attention_mask, action_mask))
    return out


def test_the_carried_loss_trains_as_the_legacy_training_step():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = tiny_config("llama", vocab_size=len(build_tokenizer()))
    legacy_model = AutoModelForCausalLM.from_config(config).float()
    engine_model = copy.deepcopy(legacy_model)
    step = legacy_training_step()
    initial = copy.deepcopy(legacy_model)
    legacy_self = SimpleNamespace(actor=_LegacyActor(legacy_model),
                                  actor_optim=torch.optim.Adam(legacy_model.parameters(), lr=LR))
    loss_fn = carried_loss()
    engine_optim = torch.optim.Adam(engine_model.parameters(), lr=LR)
    batches = rollouts(legacy_model, STEPS)
    legacy_losses, engine_losses = [], []
    for exp in batches:
        legacy_losses.append(step(legacy_self, copy.deepcopy(exp))["pg_loss"])
        total = 0.0
        for part in (slice(0, BATCH // 2), slice(BATCH // 2, BATCH)):  # two micro-batches, as the learner splits
            mask = exp.action_mask[part].float()
            logp = response_logprobs(engine_model, exp.sequences[part], exp.attention_mask[part], ACTIONS)
            loss, _ = loss_fn(logp, exp.action_log_probs[part], exp.advantages[part], mask, num_samples=float(BATCH),
                              clip_eps_low=0.2, clip_eps_high=0.2, beta=0.0, per_token_kl=None)
            loss.backward()
            total += loss.item()
        engine_optim.step()
        engine_optim.zero_grad()
        engine_losses.append(total)
    assert max(abs(v) for v in legacy_losses) > 1e-3, "a loss of zero would prove nothing"
    for i, (legacy, engine) in enumerate(zip(legacy_losses, engine_losses)):
        assert engine == pytest.approx(legacy, rel=RTOL, abs=ATOL), f"step {i}"
    for (name, a), (_, b) in zip(legacy_model.state_dict().items(), engine_model.state_dict().items()):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=WEIGHT_ATOL, msg=lambda m, name=name: f"{name}: {m}")
    assert (legacy_model.lm_head.weight - initial.lm_head.weight).abs().max() > 1e-4, "the steps did train"


class _LegacyActor:
    """The legacy actor's call: ``actor(sequences, num_actions, attention_mask=...)`` -> log-probs [B,A]."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def train(self):
        self.model.train()

    def __call__(self, sequences, num_actions, attention_mask=None):
        return action_log_probs(self.model, sequences, num_actions, attention_mask)
