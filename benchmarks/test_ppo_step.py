"""Pair 2, the PPO training step on one fixed batch of experience.

- old: ``coati_compat.reference.ppo_training_step``: the legacy ``DetachedPPOTrainer.training_step`` (actor loss,
  backward, Adam step; then the critic's), two plain torch optimizers, the legacy losses.
- new, legacy math: the engine's pieces doing the same math: `TrainingBackend` (ColossalAI Booster, DDP plugin) for
  policy and critic, `response_logprobs`, ``algorithms.policy_loss`` (sample-level, eps 0.2: the legacy
  ``PolicyLoss``) and ``algorithms.value_loss`` on the reference-version critic value. Its first step's losses equal
  the reference's.
- new, engine PPO: ``ConsumerWorker.train_round``, the consumer's whole PPO round on the same batch: no-grad
  reference log-probs and token values, KL-shaped token rewards, GAE, whitened advantages, then one optimizer step
  of policy and critic (token-level values). Its math differs from the legacy one, so its losses are not compared;
  it trains the same sequences with one step per model.

All three start from the weights of one checkpoint, at the legacy ``lr=1e-7``, with the whole batch in one forward.
"""
from __future__ import annotations

import copy

import pytest
import torch

from coati_compat.reference.experience import action_log_probs
from coati_compat.reference.training import ppo_training_step
from coati_relay.rollout import Rollout

BATCH, PROMPT, RESPONSE, LR, SEED = 8, 16, 48, 1e-7, 0
ROUNDS, WARMUP = 10, 1
RTOL, ATOL = 1e-5, 1e-6
MODELS = {"h128-l2": "tiny_model_path", "h256-l4": "small_model_path"}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    """(name, checkpoint path) of the model the module's benchmarks train."""
    return request.param, request.getfixturevalue(MODELS[request.param])


def _group(model_name: str) -> str:
    return f"PPO training step ({model_name}, {BATCH} x ({PROMPT} + {RESPONSE}) tokens)"


@pytest.fixture(scope="module")
def initial(model):
    """The starting modules: HF causal LM (actor), transformer body and value head (critic)."""
    from transformers import AutoModel, AutoModelForCausalLM

    _, path = model
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    body = AutoModel.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(SEED)
    head = torch.nn.Linear(body.config.hidden_size, 1)
    return actor, body, head


@pytest.fixture(scope="module")
def batch(initial):
    """Legacy experience dict: random tokens (no pad, no EOS: every mask is all ones), behaviour log-probs near the
    actor's, random values and rewards, ``advantages = reward - values`` [B,1]."""
    g = torch.Generator().manual_seed(SEED)
    seq = torch.randint(6, 320, (BATCH, PROMPT + RESPONSE), generator=g)
    attention_mask = torch.ones_like(seq)
    with torch.no_grad():
        logp = action_log_probs(initial[0], seq, RESPONSE, attention_mask)
    values = 0.5 * torch.randn(BATCH, generator=g)
    reward = torch.randn(BATCH, generator=g)
    return {"sequences": seq, "action_log_probs": logp + 0.1 * torch.randn(logp.shape, generator=g),
            "values": values, "reward": reward, "advantages": (reward - values)[:, None],
            "attention_mask": attention_mask, "action_mask": torch.ones(BATCH, RESPONSE, dtype=torch.bool)}


def _rollout(batch) -> Rollout:
    seq = batch["sequences"]
    return Rollout(prompt_ids=seq[:, :PROMPT], prompt_mask=torch.ones(BATCH, PROMPT, dtype=torch.long),
                   response_ids=seq[:, PROMPT:], response_mask=batch["action_mask"].clone(),
                   logprobs=batch["action_log_probs"].clone(),
                   response_lengths=torch.full((BATCH,), RESPONSE, dtype=torch.long), rewards=batch["reward"].clone())


class LegacySide:
    """The reference step on copies of the initial modules, Adam for actor and for critic."""

    def __init__(self, initial):
        self.actor, self.body, self.head = (copy.deepcopy(m) for m in initial)
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=LR)
        self.critic_optim = torch.optim.Adam(list(self.body.parameters()) + list(self.head.parameters()), lr=LR)

    def step(self, batch):
        return ppo_training_step(self.actor, self.body, self.head, self.actor_optim, self.critic_optim, batch)


class EngineLegacyMathSide:
    """Engine pieces on copies of the initial modules: Booster-wrapped policy and critic, engine losses."""

    def __init__(self, initial):
        from coati_relay.training.booster_backend import TrainingBackend
        from coati_relay.training.critic import CriticModel

        actor, body, head = (copy.deepcopy(m) for m in initial)
        self.policy = TrainingBackend(actor, lr=LR)
        self.critic = TrainingBackend(CriticModel(body, head), lr=LR)

    def step(self, batch):
        from coati_relay import algorithms as algos
        from coati_relay.roles.logprobs import response_logprobs

        seq, attn, mask = batch["sequences"], batch["attention_mask"], batch["action_mask"]
        self.policy.train()
        self.critic.train()
        logp = response_logprobs(self.policy.model, seq, attn, RESPONSE)
        actor_loss, _ = algos.policy_loss(logp, batch["action_log_probs"], batch["advantages"], mask,
                                          clip_eps_low=0.2, aggregation="sample_level")
        self.policy.backward(actor_loss)
        self.policy.step()
        self.policy.zero_grad()
        token_values = self.critic.model(seq, attn)  # [B, S]
        # The reference-version critic: the mean value over the prompt tokens.
        values = algos.masked_mean(token_values[:, :PROMPT], attn[:, :PROMPT], dim=1)
        critic_loss = algos.value_loss(values, batch["values"], batch["reward"], clip_eps=0.4)
        self.critic.backward(critic_loss)
        self.critic.step()
        self.critic.zero_grad()
        return {"actor_loss": actor_loss.item(), "critic_loss": critic_loss.item()}


@pytest.fixture(scope="module")
def first_legacy_step(initial, batch):
    """Losses of the reference step from the initial weights (the oracle of the engine's legacy-math step)."""
    return LegacySide(initial).step(batch)


def _params(module: torch.nn.Module):
    return [p.detach().clone() for p in module.parameters()]


def _moved(before, module: torch.nn.Module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_legacy_step(benchmark, work, model, initial, batch, first_legacy_step):
    side = LegacySide(initial)
    before = _params(side.actor)
    first = side.step(batch)
    for key in ("actor_loss", "critic_loss"):
        assert first[key] == pytest.approx(first_legacy_step[key], rel=RTOL, abs=ATOL), key
    benchmark.group = _group(model[0])
    out = benchmark.pedantic(side.step, args=(batch,), rounds=ROUNDS, warmup_rounds=WARMUP)
    work["tokens"] = BATCH * (PROMPT + RESPONSE)
    assert _moved(before, side.actor)
    assert torch.isfinite(torch.tensor(list(out.values()))).all()


def test_engine_step_legacy_math(benchmark, work, model, initial, batch, first_legacy_step):
    side = EngineLegacyMathSide(initial)
    before = _params(side.policy.unwrapped())
    first = side.step(batch)
    for key in ("actor_loss", "critic_loss"):
        assert first[key] == pytest.approx(first_legacy_step[key], rel=RTOL, abs=ATOL), key
    benchmark.group = _group(model[0])
    out = benchmark.pedantic(side.step, args=(batch,), rounds=ROUNDS, warmup_rounds=WARMUP)
    work["tokens"] = BATCH * (PROMPT + RESPONSE)
    assert _moved(before, side.policy.unwrapped())
    assert torch.isfinite(torch.tensor(list(out.values()))).all()


@pytest.fixture(scope="module")
def consumer(ray_session, model, tmp_path_factory):
    """A real PPO `ConsumerWorker` (rank 0 of 1; it publishes its weights to a real weight store)."""
    from coati_relay.assembly.build import build_run_config
    from coati_relay.exchange.weight_store import make_weight_store
    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.toy import write_toy_dataset
    from coati_relay.training.distributed import process_group_env_kept

    name, path = model
    d = tmp_path_factory.mktemp(f"ppo-{name}")
    cfg = build_run_config(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
        inference_batch_size=BATCH, inference_microbatch_size=BATCH, train_batch_size=BATCH,
        train_minibatch_size=BATCH, num_generations=1, core_algo="PPO",
        train_dataset_config={"path": str(write_toy_dataset(d / "prompts.jsonl", num_prompts=BATCH)),
                              "system_prompt": ""},
        inference_model_config={"path": path}, train_model_config={"path": path},
        generate_config={"max_new_tokens": RESPONSE, "temperature": 1.0}, plugin_config={},
        grpo_config={"lr": LR, "critic_lr": LR, "train_microbatch_size": BATCH, "kl_coef": 0.1,
                     "reward_fn_type": "toy_letter"},
        run_dir=str(d / "run"), progress=False, seed=SEED)
    worker = ConsumerWorker(0, cfg, queue=None, weight_store=make_weight_store())
    with process_group_env_kept():  # the group is this process's own: processes started later must not see it
        worker.setup(*worker.rendezvous()[:2])
    return worker


def test_engine_train_round(benchmark, work, model, consumer, batch):
    before = _params(consumer.policy.unwrapped())
    rollout = _rollout(batch)
    benchmark.group = _group(model[0])
    stats = benchmark.pedantic(consumer.train_round, args=(rollout,), rounds=ROUNDS, warmup_rounds=WARMUP)
    work["tokens"] = BATCH * (PROMPT + RESPONSE)
    assert rollout.sequences.shape == batch["sequences"].shape and torch.equal(rollout.sequences, batch["sequences"])
    assert torch.isfinite(torch.tensor([stats["loss"], stats["value_loss"]])).all()
    assert stats["reward"] == pytest.approx(batch["reward"].mean().item())
    assert _moved(before, consumer.policy.unwrapped())
