"""Pair 1, experience making: the legacy maker's step vs the engine's producer path, for the same prompts.

- old: the body of ``NaiveExperienceMaker.make_experience``: the legacy multinomial sampling loop
  (``Actor.generate``), then ``experience_from_sequences``: forwards of the actor, the initial model, the critic and
  the reward model, KL-shaped reward, ``advantage = reward - value``.
- new: ``backend.generate`` (transformers or vLLM; the behaviour log-probs come with the samples), the reward
  model's score, the initial model's log-probs and the critic's values: the producer's step plus the no-grad part of
  the consumer's PPO round, which together make what the legacy maker made.

Both sides sample ``MAX_NEW_TOKENS`` tokens for each of ``BATCH`` prompts at temperature 1 (no EOS stop: the legacy
loop without ``early_stopping`` always runs to ``max_length``, so the engine runs with ``ignore_eos``), with every
model holding the weights of one checkpoint (the medium model, where vLLM starts to pay off on CPU). Throughput
counts generated tokens; ``generate_s`` in ``extra_info`` is the sampling part of a round (mean of the timed rounds).
"""
from __future__ import annotations

import time

import pytest
import torch

from coati_relay.config.schema import SamplingConfig

BATCH, MAX_NEW_TOKENS, KL_COEF, SEED = 16, 64, 0.1, 0
GROUP = f"experience making (h512-l8, {BATCH} prompts x {MAX_NEW_TOKENS} tokens)"
ROUNDS, WARMUP = 5, 1


@pytest.fixture(scope="module")
def vllm_model_path(medium_model_path):
    return medium_model_path


@pytest.fixture(scope="module")
def prompts():
    """BATCH token-id prompts of 8 to 24 tokens (no special tokens), seeded."""
    g = torch.Generator().manual_seed(SEED)
    lengths = torch.randint(8, 25, (BATCH,), generator=g).tolist()
    return [torch.randint(6, 320, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def legacy_maker(medium_model_path):
    """The legacy maker with its four models on the checkpoint (critic valued as in the reference version)."""
    from transformers import AutoModel, AutoModelForCausalLM

    from coati_compat.legacy.experience_maker import NaiveExperienceMaker
    from coati_compat.legacy.model_base import Actor, Critic, RewardModel

    def causal_lm():
        return AutoModelForCausalLM.from_pretrained(medium_model_path, dtype=torch.float32)

    def body():
        return AutoModel.from_pretrained(medium_model_path, dtype=torch.float32)

    torch.manual_seed(SEED)
    hidden = body().config.hidden_size
    critic = Critic(body(), torch.nn.Linear(hidden, 1), use_action_mask=True)
    reward_model = RewardModel(body(), torch.nn.Linear(hidden, 1))
    maker = NaiveExperienceMaker(Actor(causal_lm()), critic, reward_model, Actor(causal_lm()), kl_coef=KL_COEF)
    for model in (maker.actor, maker.critic, maker.reward_model, maker.initial_model):
        model.eval()
    return maker


@pytest.fixture(scope="module")
def engine_scorers(medium_model_path):
    """What the engine runs besides generation: reward model, initial (reference) model, critic."""
    from coati_relay.rewards import RewardModelScorer
    from coati_relay.training.booster_backend import load_causal_lm
    from coati_relay.training.critic import CriticModel

    return {"reward_model": RewardModelScorer.from_causal_lm(medium_model_path, seed=SEED),
            "initial": load_causal_lm(medium_model_path).eval(),
            "critic": CriticModel.from_pretrained(medium_model_path, seed=SEED).eval()}


def _sampling() -> SamplingConfig:
    return SamplingConfig(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, ignore_eos=True, seed=SEED)


def _left_pad(prompts, pad_id):
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _record_generate_seconds(benchmark, seconds) -> None:
    timed = seconds[-ROUNDS:]
    benchmark.extra_info["generate_s"] = sum(timed) / len(timed)


@torch.no_grad()
def _legacy_experience(maker, input_ids, generate_kwargs, generate_seconds):
    t0 = time.perf_counter()
    sequences, attention_mask, action_mask = maker.actor.generate(input_ids, return_action_mask=True,
                                                                  **generate_kwargs)
    generate_seconds.append(time.perf_counter() - t0)
    return maker.experience_from_sequences(sequences, attention_mask, action_mask)


def test_legacy_maker(benchmark, work, legacy_maker, prompts, medium_model_path):
    from transformers import AutoTokenizer

    pad_id = AutoTokenizer.from_pretrained(medium_model_path).pad_token_id
    input_ids, attention_mask = _left_pad(prompts, pad_id)
    max_length = input_ids.size(1) + MAX_NEW_TOKENS
    generate_kwargs = dict(attention_mask=attention_mask, max_length=max_length, do_sample=True, temperature=1.0,
                           pad_token_id=pad_id)
    generate_seconds = []
    benchmark.group = GROUP
    torch.manual_seed(SEED)
    exp = benchmark.pedantic(_legacy_experience, args=(legacy_maker, input_ids, generate_kwargs, generate_seconds),
                             rounds=ROUNDS, warmup_rounds=WARMUP)
    work["tokens"] = BATCH * MAX_NEW_TOKENS
    _record_generate_seconds(benchmark, generate_seconds)
    assert exp.sequences.shape == (BATCH, max_length)
    assert exp.action_mask.shape == exp.action_log_probs.shape == (BATCH, MAX_NEW_TOKENS)
    assert exp.values.shape == exp.reward.shape == (BATCH,) and exp.advantages.shape == (BATCH, 1)
    assert torch.isfinite(exp.reward).all() and torch.isfinite(exp.action_log_probs).all()


@torch.no_grad()
def _engine_experience(backend, scorers, prompts, generate_seconds):
    """The engine's producer step plus the consumer's no-grad PPO inputs; returns the rollout with them set."""
    from coati_relay.roles.logprobs import response_logprobs

    t0 = time.perf_counter()
    rollout = backend.generate(prompts, 1)
    generate_seconds.append(time.perf_counter() - t0)
    seq, attn = rollout.sequences, rollout.attention_mask
    prompt_len, num_resp = rollout.prompt_ids.size(1), rollout.response_ids.size(1)
    rollout.rewards = scorers["reward_model"](seq, attn)
    rollout.ref_logprobs = response_logprobs(scorers["initial"], seq, attn, num_resp)
    rollout.values = scorers["critic"](seq, attn)[:, prompt_len - 1: prompt_len - 1 + num_resp]
    return rollout


@pytest.mark.parametrize("backend_name", ["transformers", "vllm"])
def test_engine_producer(benchmark, work, request, backend_name, engine_scorers, prompts, medium_model_path):
    if backend_name == "vllm":
        backend = request.getfixturevalue("vllm_backend")
        backend.sampling = _sampling()
    else:
        from coati_relay.inference import TransformersBackend

        backend = TransformersBackend(medium_model_path, _sampling(), seed=SEED)
    generate_seconds = []
    benchmark.group = GROUP
    rollout = benchmark.pedantic(_engine_experience, args=(backend, engine_scorers, prompts, generate_seconds),
                                 rounds=ROUNDS, warmup_rounds=WARMUP)
    work["tokens"] = BATCH * MAX_NEW_TOKENS
    _record_generate_seconds(benchmark, generate_seconds)
    assert rollout.response_ids.shape == (BATCH, MAX_NEW_TOKENS)
    assert int(rollout.response_lengths.sum()) == BATCH * MAX_NEW_TOKENS
    assert rollout.ref_logprobs.shape == rollout.values.shape == (BATCH, MAX_NEW_TOKENS)
    assert rollout.rewards.shape == (BATCH,) and torch.isfinite(rollout.rewards).all()
    # The initial model holds the generating weights, so its log-probs are the behaviour log-probs.
    tolerance = 1e-3 if backend_name == "vllm" else 1e-4
    assert (rollout.ref_logprobs - rollout.logprobs).abs().max() < tolerance
