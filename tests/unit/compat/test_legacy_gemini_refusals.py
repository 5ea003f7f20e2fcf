"""The legacy strategies under Gemini (ZeRO-3), checked on the CPU with the backend's Gemini flags set by hand (Gemini
itself needs CUDA; the GPU lane runs it): ``save_pretrained`` is refused as the legacy stage-3 strategy refused it;
sampling from a prepared actor, and a maker, are refused once Gemini frees the parameters outside its hooks."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from coati_compat.legacy import strategies
from coati_compat.legacy.model_base import Actor
from coati_relay.training.booster_backend import TrainingBackend

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def tiny_actor() -> Actor:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return Actor(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=16,
                                            bos_token_id=0, eos_token_id=0)))


@pytest.fixture
def gemini_held(monkeypatch):
    """Every backend reports Gemini holding its model."""
    monkeypatch.setattr(TrainingBackend, "shards_parameters", property(lambda self: True))


def test_save_pretrained_is_refused_under_gemini_as_the_legacy_stage_3_strategy_did(gemini_held, tmp_path):
    strategy = strategies.NaiveStrategy()
    actor = strategy.prepare(tiny_actor())
    with pytest.raises(RuntimeError, match="stage-3 does not support save_pretrained"):
        strategy.save_pretrained(actor, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_save_pretrained_still_saves_without_gemini(tmp_path):
    strategy = strategies.NaiveStrategy()
    actor = strategy.prepare(tiny_actor())
    strategy.save_pretrained(actor, str(tmp_path / "out"))
    assert (tmp_path / "out" / "config.json").is_file()


@pytest.mark.parametrize("released", [False, True])
def test_a_gemini_prepared_actor_samples_only_while_gemini_keeps_its_chunks(monkeypatch, released):
    actor = tiny_actor()
    wrapper = nn.ModuleDict({"module": actor})  # stands for the GeminiDDP around the actor
    backend = SimpleNamespace(model=wrapper, unwrapped=lambda: actor, shards_parameters=True)
    monkeypatch.setattr(strategies, "releases_parameters", lambda model: released)
    boosted = strategies._keep_actor_generate(backend)
    prompt = torch.tensor([[1, 2, 3]])
    if released:
        with pytest.raises(RuntimeError, match="generate on the actor is refused.*freed memory"):
            boosted.generate(prompt, max_length=5)
    else:
        sequences, _, _ = boosted.generate(prompt, max_length=5)
        assert sequences.shape == (1, 5)


def test_a_maker_strategy_refuses_models_whose_parameters_gemini_frees(gemini_held, monkeypatch):
    strategy = strategies.NaiveStrategy()
    actor = strategy.prepare(tiny_actor())
    strategy.check_parameters_readable(actor, "sampling")  # Gemini keeps the chunks: readable
    monkeypatch.setattr(strategies, "releases_parameters", lambda model: True)
    with pytest.raises(RuntimeError, match="sampling on the actor is refused"):
        strategy.check_parameters_readable(actor, "sampling")
