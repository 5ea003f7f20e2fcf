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
from coati_compat.shims.maker_sampler import EngineSampler, resolve_sampler
from coati_relay.inference.module_checkpoint import module_weights

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
    if s.backend is not None:
        s.backend.close()


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
        engine = sampler.generate(actor.model, PROMPTS, max_length=14, top_k=1, attention_mask=MASK, **kw)
        for a, b in zip(legacy, engine):
            assert (a is None and b is None) or torch.equal(a, b), kw
    legacy_seq = actor.generate(PROMPTS, max_length=14, top_k=1, attention_mask=MASK, eos_token_id=eos_row0,
                                pad_token_id=0)[0]
    assert legacy_seq[0, 8:].eq(0).all() and legacy_seq.size(1) == 14, "padded after EOS, runs to max_length"


def test_early_stopping_ends_at_the_longest_response_once_every_row_stopped(actor, sampler):
    first = int(greedy_tokens(actor)[1, 0])  # row 1's first token as its EOS: row 1 stops at once
    row1 = PROMPTS[1:]
    legacy = actor.generate(row1, max_length=14, top_k=1, eos_token_id=first, pad_token_id=0, early_stopping=True)
    engine = sampler.generate(actor.model, row1, max_length=14, top_k=1, eos_token_id=first, pad_token_id=0,
                              early_stopping=True)
    assert legacy[0].shape == (1, 6) and torch.equal(legacy[0], engine[0])
    assert torch.equal(legacy[2], engine[2])


def test_refuses_what_the_legacy_loop_refuses(actor, sampler):
    with pytest.raises(NotImplementedError, match="samples only"):
        sampler.generate(actor.model, PROMPTS, max_length=14, do_sample=False)
    with pytest.raises(ValueError, match="needs pad_token_id"):
        sampler.generate(actor.model, PROMPTS, max_length=14, eos_token_id=3)
    same = sampler.generate(actor.model, PROMPTS, max_length=5)[0]
    assert torch.equal(same, PROMPTS), "max_length within the prompt: the prompt comes back"


def test_behaviour_logprobs_follow_the_actor_across_a_push(tiny_model_path, sampler):
    """The log-prob oracle: after each push the engine samples from the actor it was pushed (vLLM and
    transformers report the log-probs of the tokens they drew; the actor recomputes them)."""
    from transformers import AutoModelForCausalLM

    from coati_relay.roles.logprobs import response_logprobs
    from coati_relay.toy import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    other = AutoModelForCausalLM.from_pretrained(str(build_tiny_model(seed=3)), dtype=torch.float32)
    fresh = EngineSampler(sampler.kind)
    try:
        for version in (0, 1):
            if version:
                model.load_state_dict(other.state_dict())  # what a trainer's push does to the maker's actor
                fresh.load(model, other.state_dict())  # and to its engine
            fresh.start(model, version)
            rollout = fresh.backend.generate([[5, 6, 7], [9, 10, 11, 12, 13]], 4)
            mine = response_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.response_ids.size(1))
            mask = rollout.response_mask
            assert torch.allclose(rollout.logprobs[mask], mine[mask], atol=2e-3), f"version {version}"
    finally:
        fresh.backend.close()


def test_lora_layers_reach_the_sampler_merged(actor):
    from coati_compat.legacy.lora import convert_to_lora_module

    torch.manual_seed(0)
    lora = Actor(type(actor.model)(actor.model.config)).eval()
    lora.model.load_state_dict(actor.model.state_dict())
    convert_to_lora_module(lora.model, lora_rank=4)
    layers = [m for m in lora.model.modules() if isinstance(m, LoraLinear)]
    for layer in layers:
        torch.nn.init.normal_(layer.lora_B, std=0.05)
    weights = module_weights(lora.model)
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


# -- the maker on the engine: one copy of the actor (transformers), pushes reaching vLLM --------------------------
def llama_makers_models(lora_rank=0):
    from coati_compat.legacy.model_families import LlamaActor, LlamaCritic, LlamaRM
    from coati_relay.toy import tiny_config

    def models():
        torch.manual_seed(1)
        cfg = tiny_config("llama")
        return (LlamaActor(config=cfg, lora_rank=lora_rank), LlamaCritic(config=cfg, use_action_mask=True),
                LlamaRM(config=cfg), LlamaActor(config=cfg))
    return models


def llama_maker(sampler, lora_rank=0, **kw):
    from coati_compat.legacy.strategies import NaiveStrategy
    from coati_compat.shims.maker_holder import ExperienceMakerHolderImpl

    return ExperienceMakerHolderImpl(["trainer0"], NaiveStrategy, llama_makers_models(lora_rank), max_length=14,
                                     pad_token_id=0, eos_token_id=1, top_k=1, sampler=sampler, **kw)


def push(maker, **payload):
    maker.update_experience_maker(chunk_start=True)
    maker.update_experience_maker(**payload)
    maker.update_experience_maker(chunk_end=True)


def legacy_greedy(maker, prompts):
    """The legacy loop on the maker's torch actor (top_k=1): the sequences its engine must sample."""
    return maker.experience_maker.actor.generate(prompts, max_length=14, top_k=1, pad_token_id=0, eos_token_id=1)[0]


PUSH_PROMPTS = torch.randint(2, 300, (3, 6), generator=torch.Generator().manual_seed(5))


def test_transformers_maker_holds_one_copy_of_the_actor(monkeypatch):
    """The backend generates with the actor's HF module itself: no temporary checkpoint, no second copy, and a
    push is sampled from at once (weights read in place), the version being the backend's."""
    import tempfile

    def no_temp_dirs(*args, **kwargs):
        raise AssertionError("the transformers maker wrote a temporary checkpoint")

    monkeypatch.setattr(tempfile, "mkdtemp", no_temp_dirs)
    maker = llama_maker("transformers")
    actor = maker._actor_model()
    first = maker._make_experience(PUSH_PROMPTS)
    backend = maker._sampler.backend
    assert backend.model is actor and backend.tokenizer is None
    assert {k: v.data_ptr() for k, v in backend._params.items()} == {k: v.data_ptr()
                                                                     for k, v in actor.state_dict().items()}
    torch.manual_seed(7)
    other = type(actor)(actor.config).state_dict()
    push(maker, new_actor_state_dict=other)
    assert maker.get_weight_version() == backend.weight_version == 1
    assert torch.equal(actor.state_dict()["lm_head.weight"], other["lm_head.weight"])
    after = maker._make_experience(PUSH_PROMPTS).sequences
    assert torch.equal(after, legacy_greedy(maker, PUSH_PROMPTS)) and not torch.equal(after, first.sequences)


@pytest.mark.parametrize("kind", ["full", "lora", "full-into-lora-actor"])
def test_vllm_maker_samples_from_the_pushed_weights(kind):
    """After a push, vLLM samples from the pushed weights (the pushed tensors; for LoRA pushes and LoRA layers the
    folded weights of the touched layers): with top_k=1 its sequences are the legacy loop's on the pushed actor."""
    from coati_compat.legacy.lora import LoRAConstructor

    maker = llama_maker("vllm", lora_rank=0 if kind == "full" else 4, update_lora_weights=kind == "lora")
    try:
        before = maker._make_experience(PUSH_PROMPTS).sequences  # starts the engine on the initial weights
        assert torch.equal(before, legacy_greedy(maker, PUSH_PROMPTS))
        actor = maker._actor_model()
        torch.manual_seed(7)
        if kind == "lora":
            configs = LoRAConstructor.extract_lora_config(actor)
            sd = {}
            for n in list(configs)[:4]:
                layer = actor.get_submodule(n)
                sd[f"{n}.lora_A"] = torch.randn_like(layer.lora_A)
                sd[f"{n}.lora_B"] = torch.randn_like(layer.lora_B) * 0.5
            push(maker, new_actor_state_dict=sd, new_actor_lora_config_dict=configs)
        else:  # every weight, LoRA adapters (made non-zero) included where the actor has them
            push(maker, new_actor_state_dict={k: v + 0.5 * torch.randn_like(v) for k, v in actor.state_dict().items()})
        after = maker._make_experience(PUSH_PROMPTS).sequences
        assert maker.get_weight_version() == maker._sampler.backend.weight_version == 1
        assert not torch.equal(after, before), "the push changed the greedy continuation"
        assert torch.equal(after, legacy_greedy(maker, PUSH_PROMPTS))
    finally:
        maker._sampler.backend.close()


@pytest.mark.parametrize("manager", [False, True], ids=["plain", "LORA_MANAGER"])
def test_lora_actor_modes_survive_the_transformers_backend(manager, monkeypatch):
    """`TransformersBackend.around` puts the module in eval mode and restores its mode: on legacy LoRA layers (which
    merge and unmerge on mode switches) neither the weights a push loads nor the experience may change."""
    from coati_compat.legacy import lora as legacy_lora

    monkeypatch.setattr(legacy_lora.LORA_MANAGER, "merge_weights", manager)
    maker = llama_maker("transformers", lora_rank=4, update_lora_weights=True)
    actor = maker._actor_model()
    for layer in actor.modules():
        if isinstance(layer, LoraLinear):
            torch.nn.init.normal_(layer.lora_B, std=0.5)
    maker.experience_maker.actor.eval()  # as make_experience leaves it (LORA_MANAGER: merged here, as legacy did)
    state = {k: v.clone() for k, v in actor.state_dict().items()}
    expected = legacy_greedy(maker, PUSH_PROMPTS)
    for _ in range(2):
        assert torch.equal(maker._make_experience(PUSH_PROMPTS).sequences, expected)
        now = actor.state_dict()
        assert now.keys() == state.keys() and all(torch.equal(now[k], state[k]) for k in state)
    name = next(n for n, m in actor.named_modules() if isinstance(m, LoraLinear))
    a, b = torch.randn(4, 128), torch.randn(128, 4) * 0.1
    configs = legacy_lora.LoRAConstructor.extract_lora_config(actor) or {name: legacy_lora.LoRAConfig(4, 1)}
    push(maker, new_actor_state_dict={f"{name}.lora_A": a, f"{name}.lora_B": b}, new_actor_lora_config_dict=configs)
    w0 = state[f"{name}.weight"]
    torch.testing.assert_close(actor.state_dict()[f"{name}.weight"], w0 + configs[name].lora_alpha / 4 * b @ a)
    assert torch.equal(maker._make_experience(PUSH_PROMPTS).sequences, legacy_greedy(maker, PUSH_PROMPTS))
