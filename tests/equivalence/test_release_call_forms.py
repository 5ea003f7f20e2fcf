"""Level 1 of the equivalence for the call forms of both legacy releases on the models side: the reference version
(``b5f056636``) and the final release (``be400a093``) call ``generate``, ``Actor.forward``,
``calc_action_log_probs``, ``masked_mean``, ``get_base_model``, the critic and the losses differently; each form
gives the legacy numbers (coati_compat.reference, fp32 on CPU, rtol=1e-5, atol=1e-6). Where the forms cannot be
told apart, the reference meaning holds and ``COATI_RELAY_LEGACY_NAMES=final`` gives the final release's."""
from __future__ import annotations

import importlib
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from coati_compat.imports import finder
from coati_compat.legacy.generation import generate
from coati_compat.legacy.losses import PolicyLoss, ValueLoss
from coati_compat.legacy.model_base import get_base_model
from coati_compat.legacy.model_families import GPTRM, GPTActor, GPTCritic
from coati_compat.legacy.rl_functions import calc_action_log_probs, masked_mean
from coati_compat.reference import experience as ref_exp
from coati_compat.reference import losses as ref

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

TOL = dict(rtol=1e-5, atol=1e-6)
SEEDS = [0, 1, 2]
VOCAB, PAD, EOS = 40, 0, 1
SWITCH = "COATI_RELAY_LEGACY_NAMES"


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _config():
    from transformers import GPT2Config

    return GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {"actor": GPTActor(config=_config()).eval(), "critic": GPTCritic(config=_config()).eval(),
            "critic_prompt": GPTCritic(config=_config(), use_action_mask=True).eval(),
            "rm": GPTRM(config=_config()).eval()}


def _batch(seed, batch=3, length=9):
    g = _gen(seed)
    seq = torch.randint(2, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(seq)
    mask[0, :2] = 0  # left padding
    mask[1, -3:] = 0  # right padding: the final release's "last non-pad token" is not the last position
    return seq, mask


class _Tokenizer:
    def __init__(self, padding_side="left"):
        self.padding_side, self.eos_token_id, self.pad_token_id = padding_side, EOS, PAD


class _Logits(nn.Module):
    """A causal LM stand-in that returns fixed logits, so the reference can score them."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.logits)


# generate: (model, input_ids, max_length, ..., eos_token_id, pad_token_id) vs (model, input_ids, tokenizer, ...)

@pytest.mark.parametrize("seed", SEEDS)
def test_generate_final_form_takes_ids_from_the_tokenizer_and_samples_as_the_reference_form(models, seed):
    actor = models["actor"]
    prompts, mask = _batch(seed, length=5)
    torch.manual_seed(seed)
    reference = generate(actor.model, prompts, 14, eos_token_id=EOS, pad_token_id=PAD, top_k=7, attention_mask=mask)
    torch.manual_seed(seed)
    final = generate(actor, prompts, _Tokenizer(), max_length=14, top_k=7, attention_mask=mask)
    torch.manual_seed(seed)
    positional = generate(actor, prompts, _Tokenizer(), 14, 1, True, False, 7, attention_mask=mask)  # 8th: top_k
    torch.manual_seed(seed)
    keyword = generate(actor.model, prompts, tokenizer=_Tokenizer(), max_length=14, top_k=7, attention_mask=mask)
    assert reference.shape == (3, 14)
    for other in (final, positional, keyword):
        assert torch.equal(other, reference)
    after_eos = (reference[:, 5:] == EOS).long().cumsum(1) > 0
    after_eos[:, 1:] &= after_eos[:, :-1].clone()  # positions strictly after the first EOS
    assert torch.all(reference[:, 5:][after_eos] == PAD)


def test_generate_reference_positional_order_keeps_eos_and_pad_slots(models):
    prompts, _ = _batch(0, length=4)
    torch.manual_seed(3)
    positional = generate(models["actor"].model, prompts, 10, 1, True, False, EOS, PAD, 5)
    torch.manual_seed(3)
    keyword = generate(models["actor"].model, prompts, max_length=10, eos_token_id=EOS, pad_token_id=PAD, top_k=5)
    assert torch.equal(positional, keyword)


def test_generate_rejects_what_neither_release_took(models):
    prompts, _ = _batch(0, length=4)
    actor = models["actor"]
    with pytest.raises(ValueError, match="padding_side='left'"):
        generate(actor, prompts, _Tokenizer("right"), max_length=8)
    with pytest.raises(TypeError, match="takes eos_token_id from the tokenizer"):
        generate(actor, prompts, _Tokenizer(), max_length=8, eos_token_id=EOS)
    with pytest.raises(TypeError, match="tokenizer .final-release form. or max_length"):
        generate(actor, prompts, "eight")
    with pytest.raises(TypeError, match="or generate\\(model, input_ids, tokenizer, max_length.*max_length"):
        generate(actor, prompts)


# Actor.forward: (sequences, num_actions, attention_mask) -> log-probs vs (input_ids, attention_mask) -> output

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_actions", [1, 4, 8])
def test_actor_forward_in_both_forms(models, seed, num_actions):
    actor = models["actor"]
    seq, mask = _batch(seed)
    expected = ref_exp.action_log_probs(actor.model, seq, num_actions, mask)
    torch.testing.assert_close(actor(seq, num_actions, mask), expected, **TOL)  # reference, positional
    torch.testing.assert_close(actor(sequences=seq, num_actions=num_actions, attention_mask=mask), expected, **TOL)
    logits = actor.model(input_ids=seq, attention_mask=mask).logits
    torch.testing.assert_close(actor(seq, mask).logits, logits, **TOL)  # final: a tensor in num_actions' place
    torch.testing.assert_close(actor(input_ids=seq, attention_mask=mask)["logits"], logits, **TOL)
    torch.testing.assert_close(calc_action_log_probs(actor(seq, mask)["logits"], seq, num_actions), expected, **TOL)


@pytest.mark.parametrize("num_actions", [9, 10, 50])
def test_num_actions_up_to_and_past_the_sequence_length_gives_every_log_prob(models, num_actions):
    """Legacy ``[:, -num_actions:]`` of the S-1 log-probs: both checkpoint tests ask for S actions."""
    actor = models["actor"]
    seq, mask = _batch(1)
    every = ref_exp.action_log_probs(actor.model, seq, seq.size(1) - 1, mask)
    torch.testing.assert_close(ref_exp.action_log_probs(actor.model, seq, num_actions, mask), every, **TOL)
    torch.testing.assert_close(actor(seq, num_actions, mask), every, **TOL)  # b5f056636 test_checkpoint
    logits = actor(seq, mask)["logits"]  # be400a093 test_checkpoint
    torch.testing.assert_close(calc_action_log_probs(logits, seq, num_actions), every, **TOL)


def test_actor_forward_rejects_mixed_forms(models):
    seq, mask = _batch(0)
    actor = models["actor"]
    with pytest.raises(TypeError, match="num_actions goes and an attention_mask"):
        actor(seq, mask, mask)
    with pytest.raises(TypeError, match="token ids once"):
        actor(seq, input_ids=seq)
    with pytest.raises(ValueError, match="positive int"):
        actor(seq, 0, mask)


# calc_action_log_probs(logits=...) / (output=...) and masked_mean(tensor=, mask=, dim=)

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_actions", [2, 6])
def test_calc_action_log_probs_keywords_of_both_forms(seed, num_actions):
    g = _gen(seed)
    logits = torch.randn(4, 7, 11, generator=g)
    seq = torch.randint(0, 11, (4, 7), generator=g)
    expected = ref_exp.action_log_probs(_Logits(logits), seq, num_actions, None)
    out = {"logits": logits}
    torch.testing.assert_close(calc_action_log_probs(logits=logits, sequences=seq, num_actions=num_actions),
                               expected, **TOL)
    torch.testing.assert_close(calc_action_log_probs(output=out, sequences=seq, num_actions=num_actions),
                               expected, **TOL)
    torch.testing.assert_close(calc_action_log_probs(out, seq, num_actions), expected, **TOL)
    with pytest.raises(TypeError, match="takes the logits once"):
        calc_action_log_probs(logits, seq, num_actions, output=out)
    with pytest.raises(TypeError, match="needs logits"):
        calc_action_log_probs(logits=logits, num_actions=num_actions)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape,dim", [((10,), 0), ((4, 6), 1), ((4, 6), 0)])
def test_masked_mean_by_keyword(seed, shape, dim):
    g = _gen(seed)
    x = torch.randn(*shape, generator=g)
    mask = torch.randint(0, 2, shape, generator=g)
    torch.testing.assert_close(masked_mean(tensor=x, mask=mask, dim=dim), ref.masked_mean(x, mask, dim=dim), **TOL)


# get_base_model, the critic and the reward model: forms that cannot be told apart follow the switch

def test_get_base_model_per_release(models, monkeypatch):
    actor, critic, rm = models["actor"], models["critic"], models["rm"]
    monkeypatch.delenv(SWITCH, raising=False)
    assert get_base_model(actor) is actor.model
    assert get_base_model(critic) is critic and get_base_model(rm) is rm  # b5f056636
    plain = nn.Linear(2, 2)
    assert get_base_model(plain) is plain
    monkeypatch.setenv(SWITCH, "final")
    assert get_base_model(actor) is actor.model
    assert get_base_model(critic) is critic.model and get_base_model(rm) is rm.model  # be400a093
    with pytest.raises(TypeError, match="Actor, Critic or RewardModel"):
        get_base_model(plain)


def _head_values(model, seq, mask):
    return model.value_head(model.model(input_ids=seq, attention_mask=mask).last_hidden_state)[..., 0]


def _last_non_pad(values, mask):
    """The final release's score, written out: the value at the highest position the mask keeps."""
    last = torch.stack([row.nonzero().max() if row.any() else torch.tensor(0) for row in mask])
    return values[torch.arange(values.size(0)), last]


@pytest.mark.parametrize("seed", SEEDS)
def test_critic_and_reward_model_scores_per_release(models, seed, monkeypatch):
    critic, rm = models["critic"], models["rm"]
    seq, mask = _batch(seed)
    monkeypatch.delenv(SWITCH, raising=False)
    reference = ref_exp.critic_value(critic.model, critic.value_head, seq, None, mask, use_action_mask=False)
    torch.testing.assert_close(critic(seq, attention_mask=mask), reference, **TOL)
    torch.testing.assert_close(critic(seq, mask), reference, **TOL)  # final form: the mask in the 2nd place
    torch.testing.assert_close(rm(seq, mask), ref_exp.reward_model_score(rm.model, rm.value_head, seq, mask), **TOL)
    monkeypatch.setenv(SWITCH, "final")
    expected = _last_non_pad(_head_values(critic, seq, mask), mask)
    torch.testing.assert_close(critic(seq, mask), expected, **TOL)
    torch.testing.assert_close(critic(seq, attention_mask=mask), expected, **TOL)
    torch.testing.assert_close(rm(seq, mask), _last_non_pad(_head_values(rm, seq, mask), mask), **TOL)


def test_critic_action_mask_form_is_the_reference_one(models, monkeypatch):
    critic = models["critic_prompt"]
    seq, mask = _batch(0)
    action_mask = torch.ones(3, 4, dtype=torch.bool)
    monkeypatch.delenv(SWITCH, raising=False)
    expected = ref_exp.critic_value(critic.model, critic.value_head, seq, action_mask, mask)
    torch.testing.assert_close(critic(seq, action_mask, mask), expected, **TOL)


def test_switch_rejects_unknown_values(monkeypatch, models):
    monkeypatch.setenv(SWITCH, "be400")
    with pytest.raises(ValueError, match="COATI_RELAY_LEGACY_NAMES='be400' is not understood"):
        get_base_model(models["critic"])


# losses: [B]-shaped inputs without a mask, as both releases took them

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("clip", [0.1, 0.2])
def test_policy_and_value_loss_on_one_value_per_sample(seed, batch, clip):
    g = _gen(seed)
    logp, old, adv = (torch.randn(batch, generator=g) for _ in range(3))
    torch.testing.assert_close(PolicyLoss(clip)(logp, old, adv), ref.policy_loss(logp, old, adv, clip_eps=clip),
                               **TOL)
    values, old_values, reward = (torch.randn(batch, generator=g) for _ in range(3))
    torch.testing.assert_close(ValueLoss(2 * clip)(values, old_values, reward),
                               ref.value_loss(values, old_values, reward, clip_eps=2 * clip), **TOL)


def test_policy_loss_on_one_value_per_sample_refuses_a_mask():
    x = torch.randn(4)
    with pytest.raises(ValueError, match="all \\[B\\] and no action_mask"):
        PolicyLoss()(x, x, x, action_mask=torch.ones(4))
    with pytest.raises(ValueError, match="all \\[B\\]"):
        PolicyLoss()(x, x, x[:, None])


# ChatGLM: importable at its legacy paths, fails on use naming the replacement

def test_chatglm_names_import_warn_and_fail_on_use():
    finder.install()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actor_cls = importlib.import_module("coati.models.chatglm").ChatGLMActor
        tokenizer_cls = importlib.import_module("coati.models.chatglm.chatglm_tokenizer").ChatGLMTokenizer
        with pytest.raises(NotImplementedError, match="GlmForCausalLM.*coati.models.Actor"):
            actor_cls()
        with pytest.raises(NotImplementedError, match="AutoTokenizer"):
            tokenizer_cls.from_pretrained("THUDM/chatglm-6b", trust_remote_code=True)
    warned = {str(w.message).split(" is deprecated")[0] for w in caught if w.category is FutureWarning}
    assert {"coati.models.chatglm.ChatGLMActor", "coati.models.chatglm.chatglm_tokenizer.ChatGLMTokenizer"} <= warned
    assert not isinstance(_Tokenizer(), tokenizer_cls)


# LoRA merging: the layer's own eval() (reference) vs LORA_MANAGER.merge_weights (final release)

@pytest.fixture
def lora_manager():
    from coati_compat.legacy.lora import LORA_MANAGER

    yield LORA_MANAGER
    LORA_MANAGER.merge_weights = False


def _lora_stack(seed):
    from coati_compat.legacy.lora import convert_to_lora_module

    torch.manual_seed(seed)
    model = convert_to_lora_module(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)), lora_rank=2)
    for layer in (model[0], model[2]):
        nn.init.normal_(layer.lora_B)  # a non-zero delta, so a merge changes the weights
    return model


@pytest.mark.parametrize("seed", SEEDS)
def test_lora_manager_merges_on_eval_of_any_parent(lora_manager, seed):
    model = _lora_stack(seed)
    x = torch.randn(4, 6, generator=_gen(seed))
    before = model(x)
    expected = [layer.weight + layer.lora_B @ layer.lora_A * layer.scaling for layer in (model[0], model[2])]
    model.eval()  # no manager: a parent's eval() merges nothing (either release)
    assert hasattr(model[0], "lora_A") and not model[0].merged
    lora_manager.merge_weights = True
    model.eval()
    for layer, weight in zip((model[0], model[2]), expected):
        assert layer.merged and not hasattr(layer, "lora_A")
        torch.testing.assert_close(layer.weight, weight, **TOL)
    torch.testing.assert_close(model(x), before, **TOL)
    with pytest.raises(NotImplementedError, match="cannot be unmerged"):
        model.train()


def test_layer_eval_merges_in_the_reference_version_only(monkeypatch):
    from coati_compat.legacy.lora import LoraLinear

    def layer():
        torch.manual_seed(0)
        return LoraLinear(nn.Parameter(torch.randn(3, 4)), None, r=2)

    monkeypatch.delenv(SWITCH, raising=False)
    assert layer().eval().merged  # b5f056636: merge_weights=True by default, the layer's eval() merges
    monkeypatch.setenv(SWITCH, "final")
    assert not layer().eval().merged  # be400a093: only LORA_MANAGER merges
