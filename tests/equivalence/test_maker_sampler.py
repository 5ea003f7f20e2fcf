"""The legacy maker's engine sampler (`coati_compat.shims.maker_sampler`) against the legacy loop.

Deterministic where both sides can be: with ``top_k=1`` each step takes the most likely token, so the engine
(vLLM, transformers) and the legacy loop must give the same sequences, EOS padding and widths included. Sampled runs
cannot match draw for draw (other random streams): there the engine's behaviour log-probs are checked against the
actor's own log-probs of the sampled tokens (the oracle), before and after a weight push.
"""
from __future__ import annotations

import pytest
import torch

from coati_compat.legacy.lora import LoraLinear
from coati_compat.legacy.model_base import Actor
from coati_compat.shims.maker_sampler import EngineSampler, resolve_sampler, sampler_weights

PROMPTS = torch.tensor([[0, 0, 5, 6, 7], [9, 10, 11, 12, 13]])
MASK = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])


@pytest.fixture(scope="module")
def actor(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return Actor(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)).eval()


@pytest.fixture(scope="module", params=["transformers", "vllm"])
def sampler(request):
    s = EngineSampler(request.param)
    yield s
    s.close()


def greedy_tokens(actor):
    """The legacy loop's top-k 1 continuation of each prompt, 9 tokens."""
    seq = actor.generate(PROMPTS, max_length=14, top_k=1, attention_mask=MASK)[0]
    return seq[:, 5:]


def test_greedy_sequences_equal_the_legacy_loop(actor, sampler):
    cont = greedy_tokens(actor)
    eos_row0 = int(cont[0, 2])  # a token row 0 emits at step 3 and row 1 never emits before it
    assert eos_row0 not in cont[1].tolist()
    for kw in (dict(), dict(eos_token_id=eos_row0, pad_token_id=0), dict(eos_token_id=eos_row0, pad_token_id=0,
                                                                             early_stopping=True)):
        legacy = actor.generate(PROMPTS, max_length=14, top_k=1, attention_mask=MASK, **kw)
        engine = sampler.generate(actor.model, 0, PROMPTS, max_length=14, top_k=1, attention_mask=MASK, **kw)
        for a, b in zip(legacy, engine):
            assert (a is None and b is None) or torch.equal(a, b), kw
    legacy_seq = actor.generate(PROMPTS, max_length=14, top_k=1, attention_mask=MASK, eos_token_id=eos_row0,
                                pad_token_id=0)[0]
    assert legacy_seq[0, 8:].eq(0).all() and legacy_seq.size(1) == 14, "padded after EOS, runs to max_length"


def test_early_stopping_ends_at_the_longest_response_once_every_row_stopped(actor, sampler):
    first = int(greedy_tokens(actor)[1, 0])  # row 1's first token as its EOS: row 1 stops at once
    row1 = PROMPTS[1:]
    legacy = actor.generate(row1, max_length=14, top_k=1, eos_token_id=first, pad_token_id=0, early_stopping=True)
    engine = sampler.generate(actor.model, 0, row1, max_length=14, top_k=1, eos_token_id=first, pad_token_id=0,
                              early_stopping=True)
    assert legacy[0].shape == (1, 6) and torch.equal(legacy[0], engine[0])
    assert torch.equal(legacy[2], engine[2])


def test_refuses_what_the_legacy_loop_refuses(actor, sampler):
    with pytest.raises(NotImplementedError, match="samples only"):
        sampler.generate(actor.model, 0, PROMPTS, max_length=14, do_sample=False)
    with pytest.raises(ValueError, match="needs pad_token_id"):
        sampler.generate(actor.model, 0, PROMPTS, max_length=14, eos_token_id=3)
    same = sampler.generate(actor.model, 0, PROMPTS, max_length=5)[0]
    assert torch.equal(same, PROMPTS), "max_length within the prompt: the prompt comes back"


def test_behaviour_logprobs_follow_the_actor_across_a_push(tiny_model_path, sampler):
    """The log-prob oracle: after each push the engine samples from the actor it was pushed (vLLM and
    transformers report the log-probs of the tokens they drew; the actor recomputes them)."""
    from transformers import AutoModelForCausalLM

    from coati_relay.logprobs import response_logprobs
    from coati_relay.toy import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    other = AutoModelForCausalLM.from_pretrained(str(build_tiny_model(seed=3)), dtype=torch.float32)
    fresh = EngineSampler(sampler.kind)
    try:
        for version in (0, 1):
            if version:
                model.load_state_dict(other.state_dict())  # what a trainer's push does to the maker's actor
            fresh.sync(model, version)
            rollout = fresh.backend.generate([[5, 6, 7], [9, 10, 11, 12, 13]], 4)
            mine = response_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.response_ids.size(1))
            mask = rollout.response_mask
            assert torch.allclose(rollout.logprobs[mask], mine[mask], atol=2e-3), f"version {version}"
    finally:
        fresh.close()


def test_lora_layers_reach_the_sampler_merged(actor):
    from coati_compat.legacy.lora import convert_to_lora_module

    torch.manual_seed(0)
    lora = Actor(type(actor.model)(actor.model.config)).eval()
    lora.model.load_state_dict(actor.model.state_dict())
    convert_to_lora_module(lora.model, lora_rank=4)
    layers = [m for m in lora.model.modules() if isinstance(m, LoraLinear)]
    for layer in layers:
        torch.nn.init.normal_(layer.lora_B, std=0.05)
    weights = sampler_weights(lora.model)
    assert layers and not [k for k in weights if "lora_" in k]
    plain = type(actor.model)(actor.model.config).eval()
    plain.load_state_dict(weights)
    with torch.no_grad():
        assert torch.allclose(plain(PROMPTS).logits, lora.model(PROMPTS).logits, atol=1e-5)


def test_sampler_choice(actor, monkeypatch):
    from coati_compat.shims.maker_sampler import default_sampler

    monkeypatch.delenv("COATI_RELAY_MAKER_SAMPLER", raising=False)
    assert default_sampler() == "auto"
    monkeypatch.setenv("COATI_RELAY_MAKER_SAMPLER", "legacy")
    assert default_sampler() == "legacy"
    assert resolve_sampler("auto", actor.model) == "vllm", "vLLM runs Qwen2"
    assert resolve_sampler("legacy", actor.model) == "legacy"
    with pytest.raises(ValueError, match=r"sampler \(or \$COATI_RELAY_MAKER_SAMPLER\) must be one of"):
        resolve_sampler("fast", actor.model)
