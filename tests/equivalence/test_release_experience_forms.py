"""Both legacy releases' call forms on the experience / strategy side: ``NaiveExperienceMaker`` with a tokenizer (final
release) or ``kl_coef`` (reference version) in 5th place, ``Strategy.setup_dataloader``, and the checkpoint forms of
``save_model`` / ``save_optimizer`` / ``load_*`` (single process here; several ranks in
``test_release_strategy_ranks.py``)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from coati_compat.legacy import strategy_checkpoint
from coati_compat.legacy.experience import Experience
from coati_compat.legacy.experience_maker import NaiveExperienceMaker
from coati_compat.legacy.model_families import GPTRM, GPTActor, GPTCritic
from coati_compat.legacy.replay_buffer import NaiveExperienceBuffer, NaiveReplayBuffer, buffer_dataloader
from coati_compat.legacy.strategies import NaiveStrategy
from coati_compat.legacy.trainer_ppo import _set_default_generate_kwargs
from coati_compat.reference import experience as ref_exp

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

VOCAB, PAD, EOS = 48, 0, 1
TOL = dict(rtol=1e-5, atol=1e-6)
SWITCH = "COATI_RELAY_LEGACY_NAMES"


@pytest.fixture(scope="module")
def models():
    from transformers import GPT2Config

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=EOS,
                     eos_token_id=EOS, pad_token_id=PAD, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return {"actor": GPTActor(config=cfg), "initial": GPTActor(config=cfg),
            "critic": GPTCritic(config=cfg, use_action_mask=True), "rm": GPTRM(config=cfg)}


def _four(models):
    return models["actor"], models["critic"], models["rm"], models["initial"]


def _tokenizer(padding_side: str = "left"):
    return SimpleNamespace(pad_token_id=PAD, eos_token_id=EOS, padding_side=padding_side)


def _prompts():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (3, 6), generator=g)
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = PAD, 0
    return ids, mask


# -- NaiveExperienceMaker ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["tokenizer", "tokenizer+kl", "kl", "keywords"])
def test_both_constructor_forms_make_the_reference_experience(models, form):
    """Final release: (..., tokenizer[, kl_coef]), pad/eos from the tokenizer. Reference: (..., kl_coef), pad/eos
    in the generate keywords. Both give the reference step's experience."""
    args = {"tokenizer": (_tokenizer(),), "tokenizer+kl": (_tokenizer(), 0.3), "kl": (0.3,), "keywords": ()}[form]
    kwargs = {"keywords": dict(tokenizer=_tokenizer(), kl_coef=0.3)}.get(form, {})
    maker = NaiveExperienceMaker(*_four(models), *args, **kwargs)
    kl_coef = 0.1 if form == "tokenizer" else 0.3
    assert maker.kl_coef == kl_coef
    ids, mask = _prompts()
    ids_kwargs = {} if maker.tokenizer is not None else dict(eos_token_id=EOS, pad_token_id=PAD)
    torch.manual_seed(3)
    exp = maker.make_experience(ids, attention_mask=mask, max_length=14, **ids_kwargs)
    ref = ref_exp.experience_from_sequences(
        models["actor"].model, models["initial"].model, models["critic"].model, models["critic"].value_head,
        models["rm"].model, models["rm"].value_head, exp.sequences, ids.size(1), PAD, EOS, kl_coef=kl_coef)
    for key in ref_exp.FIELDS:
        torch.testing.assert_close(getattr(exp, key), ref[key], **TOL)


def test_the_tokenizer_form_samples_as_the_keyword_form(models):
    ids, mask = _prompts()
    torch.manual_seed(5)
    with_tok = NaiveExperienceMaker(*_four(models), _tokenizer()).make_experience(ids, attention_mask=mask,
                                                                                  max_length=12)
    torch.manual_seed(5)
    with_kw = NaiveExperienceMaker(*_four(models)).make_experience(ids, attention_mask=mask, max_length=12,
                                                                   eos_token_id=EOS, pad_token_id=PAD)
    assert torch.equal(with_tok.sequences, with_kw.sequences)
    assert torch.equal(with_tok.action_mask, with_kw.action_mask)


def test_bad_constructor_arguments_say_what_was_wrong(models):
    with pytest.raises(TypeError, match="kl_coef must be a number.*tokenizer"):
        NaiveExperienceMaker(*_four(models), object())
    with pytest.raises(TypeError, match="arguments after initial_model"):
        NaiveExperienceMaker(*_four(models), 0.1, 0.2)
    with pytest.raises(TypeError, match="kl_coef must be a number"):
        NaiveExperienceMaker(*_four(models), _tokenizer(), "0.2")
    with pytest.raises(TypeError, match="both"):
        NaiveExperienceMaker(*_four(models), _tokenizer(), tokenizer=_tokenizer())
    maker = NaiveExperienceMaker(*_four(models), _tokenizer("right"))
    with pytest.raises(ValueError, match="left"):
        maker.make_experience(_prompts()[0], max_length=10)


def test_set_default_generate_kwargs_takes_the_hf_hooks(models):
    strategy = NaiveStrategy()
    out = _set_default_generate_kwargs(strategy, {"max_length": 16}, models["actor"])
    assert out["max_length"] == 16
    assert out["prepare_inputs_fn"] == models["actor"].model.prepare_inputs_for_generation


# -- setup_dataloader ---------------------------------------------------------------------------------------------
def _buffer(cls=NaiveExperienceBuffer, n: int = 10, batch: int = 2):
    buffer = cls(batch, cpu_offload=False)
    seq = torch.arange(n * 4).view(n, 4)
    buffer.append(Experience(seq, torch.zeros(n, 2), torch.arange(n).float(), torch.zeros(n), torch.zeros(n, 1),
                             torch.ones(n, 4, dtype=torch.long), torch.ones(n, 2, dtype=torch.bool)))
    return buffer


def _rows(loader):
    return [int(row) for batch in loader for row in batch.values]


@pytest.mark.parametrize("cls", [NaiveExperienceBuffer, NaiveReplayBuffer])
def test_setup_dataloader_is_a_shuffled_pass_over_the_buffer(cls):
    buffer = _buffer(cls, n=11, batch=2)
    loader = NaiveStrategy().setup_dataloader(buffer)
    assert len(loader) == 5  # 11 items, batches of 2, the incomplete one dropped (as the legacy DataLoader)
    batches = list(loader)
    assert all(isinstance(b, Experience) and b.sequences.shape == (2, 4) for b in batches)
    first, second = _rows(loader), _rows(loader)
    assert len(set(first)) == 10 and len(set(second)) == 10
    assert first != second  # a new permutation each pass


def test_each_rank_reads_its_own_share_of_one_permutation():
    buffer = _buffer(n=10, batch=2)
    shares = [_rows(buffer_dataloader(buffer, num_replicas=2, rank=r, seed=42)) for r in (0, 1)]
    assert len(shares[0]) == len(shares[1]) == 4  # 5 items a rank, 2 whole batches
    assert not set(shares[0]) & set(shares[1])
    with pytest.raises(ValueError, match="rank"):
        buffer_dataloader(buffer, num_replicas=2, rank=2)
    with pytest.raises(TypeError, match="replay buffer"):
        NaiveStrategy().setup_dataloader([1, 2, 3])


# -- checkpoint call forms ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("switch,args,kwargs,expected", [
    ("", (), {}, (True, False)),                         # both releases: one file from rank 0
    ("", (False,), {}, (False, False)),                  # reference: save_model(model, path, only_rank0)
    ("final", (True,), {}, (True, True)),                # final: save_model(model, path, shard)
    ("", (), {"shard": True}, (True, True)),
    ("final", (), {"only_rank0": False}, (False, False)),
])
def test_save_model_forms(monkeypatch, switch, args, kwargs, expected):
    monkeypatch.setenv(SWITCH, switch)
    assert strategy_checkpoint.model_save_form(args, kwargs.get("only_rank0"), kwargs.get("shard")) == expected


def test_ambiguous_or_conflicting_save_forms_are_refused(monkeypatch):
    monkeypatch.setenv(SWITCH, "")
    with pytest.raises(TypeError, match="both"):
        strategy_checkpoint.model_save_form((True,), True, None)
    with pytest.raises(ValueError, match="Pass one of them"):
        strategy_checkpoint.model_save_form((), False, True)
    with pytest.raises(TypeError, match="one more positional"):
        strategy_checkpoint.model_save_form((True, False), None, None)


@pytest.mark.parametrize("args,kwargs,expected", [
    ((False,), {}, (False, None)),          # final release: load_model(model, path, strict)
    (("cpu",), {}, (True, "cpu")),          # reference: load_model(model, path, map_location)
    (("cpu", False), {}, (False, "cpu")),   # reference: load_model(model, path, map_location, strict)
    ((), {"strict": False}, (False, None)),
])
def test_load_forms(args, kwargs, expected):
    assert strategy_checkpoint.load_form(args, kwargs.get("strict"), kwargs.get("map_location")) == expected


def _trained(models):
    model = GPTActor(config=models["actor"].model.config)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    seq = torch.randint(0, VOCAB, (2, 8))
    model(seq, 3).sum().backward()
    optim.step()
    return model, optim


def _same_optimizer_state(loaded, saved):
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(loaded.state_dict()["state"][0][key], saved.state_dict()["state"][0][key])


def test_naive_checkpoints_are_the_legacy_files(models, tmp_path, monkeypatch):
    """The reference NaiveStrategy wrote ``torch.save(state_dict)`` files; sharded saves make a directory."""
    monkeypatch.setenv(SWITCH, "")
    strategy = NaiveStrategy()
    model, optim = _trained(models)
    strategy.save_model(model, tmp_path / "m.pt")
    strategy.save_optimizer(optim, tmp_path / "o.pt")
    saved = torch.load(tmp_path / "m.pt", weights_only=True)
    assert saved.keys() == model.state_dict().keys()
    assert torch.load(tmp_path / "o.pt", weights_only=True)["state"].keys() == optim.state_dict()["state"].keys()
    strategy.save_model(model, str(tmp_path / "sharded"), shard=True)
    assert (tmp_path / "sharded").is_dir()
    fresh, fresh_optim = _trained(models)
    strategy.load_model(fresh, str(tmp_path / "sharded"), False)
    strategy.load_optimizer(fresh_optim, str(tmp_path / "o.pt"), "cpu")
    for key, value in model.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[key], value)
    _same_optimizer_state(fresh_optim, optim)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary file left behind
    with pytest.raises(FileNotFoundError, match="only rank 0"):
        strategy.load_optimizer(fresh_optim, str(tmp_path / "missing.pt"))


def test_final_switch_writes_the_sharded_optimizer_directory(models, tmp_path, monkeypatch):
    monkeypatch.setenv(SWITCH, "final")
    strategy = NaiveStrategy()
    model, optim = _trained(models)
    strategy.save_optimizer(optim, str(tmp_path / "optim"))  # final release: only_rank0=False meant shard=True
    assert (tmp_path / "optim").is_dir()
    strategy.save_model(model, str(tmp_path / "model"), True)  # final release: the third argument is shard
    assert (tmp_path / "model").is_dir()
    fresh, fresh_optim = _trained(models)
    strategy.load_optimizer(fresh_optim, str(tmp_path / "optim"))
    _same_optimizer_state(fresh_optim, optim)
    with pytest.raises(IsADirectoryError, match="sharded"):
        strategy_checkpoint.save_file({}, str(tmp_path / "optim"))
