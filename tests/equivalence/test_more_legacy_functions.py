"""Level 1 of the equivalence for the rest of ``coati.models.loss`` / ``coati.models.utils`` and the in-process
replay buffers: the shims against the reference (coati_compat.reference), fp32 on CPU, rtol=1e-5, atol=1e-6."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from coati_compat.legacy.experience import Experience, zero_pad_sequences
from coati_compat.legacy.lora import LoraLinear
from coati_compat.legacy.losses import GPTLMLoss, LogExpLoss, LogSigLoss, PPOPtxActorLoss
from coati_compat.legacy.replay_buffer import NaiveExperienceBuffer, NaiveReplayBuffer
from coati_compat.legacy.rl_functions import calc_action_log_probs, convert_to_lora, masked_normalize, normalize
from coati_compat.reference import losses as ref

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

TOL = dict(rtol=1e-5, atol=1e-6)
SEEDS = [0, 1, 2]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("batch,seq,vocab", [(1, 2, 3), (4, 9, 17), (8, 33, 64)])
def test_gpt_lm_loss(seed, batch, seq, vocab):
    g = _gen(seed)
    logits = torch.randn(batch, seq, vocab, generator=g)
    labels = torch.randint(0, vocab, (batch, seq), generator=g)
    torch.testing.assert_close(GPTLMLoss()(logits, labels), ref.gpt_lm_loss(logits, labels), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("coef,clip", [(0.0, 0.2), (0.5, 0.2), (2.0, 0.1)])
def test_ppo_ptx_actor_loss(seed, coef, clip):
    g = _gen(seed)
    logp = -torch.rand(4, 6, generator=g) * 3
    old = logp + 0.3 * torch.randn(4, 6, generator=g)
    adv = torch.randn(4, 1, generator=g)
    mask = torch.rand(4, 6, generator=g) > 0.3
    lm_logits, lm_ids = torch.randn(3, 7, 11, generator=g), torch.randint(0, 11, (3, 7), generator=g)
    ours = PPOPtxActorLoss(policy_clip_eps=clip, pretrain_coef=coef)(logp, old, adv, lm_logits, lm_ids, mask)
    torch.testing.assert_close(ours, ref.ppo_ptx_loss(logp, old, adv, lm_logits, lm_ids, mask, clip, coef), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_pairwise_reward_model_losses(seed, batch):
    g = _gen(seed)
    chosen, rejected = torch.randn(batch, generator=g) * 3, torch.randn(batch, generator=g) * 3
    torch.testing.assert_close(LogSigLoss()(chosen, rejected), ref.log_sig_loss(chosen, rejected), **TOL)
    torch.testing.assert_close(LogExpLoss()(chosen, rejected), ref.log_exp_loss(chosen, rejected), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((5, 3), 0), ((1, 6), 1)])  # legacy broadcast: see below
def test_normalize(seed, shape, dim):
    x = torch.randn(*shape, generator=_gen(seed)) * 4 + 1
    torch.testing.assert_close(normalize(x, dim=dim), ref.normalize(x, dim=dim), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", [(1, 9), (6, 6)])
def test_masked_normalize(seed, shape):
    g = _gen(seed)
    x = torch.randn(*shape, generator=g)
    mask = (torch.rand(*shape, generator=g) > 0.3).float()
    mask[:, 0] = 1
    torch.testing.assert_close(masked_normalize(x, mask), ref.masked_normalize(x, mask), **TOL)


def test_masked_normalize_keeps_the_legacy_broadcast_error():
    with pytest.raises(RuntimeError):
        masked_normalize(torch.randn(3, 5), torch.ones(3, 5))


@pytest.mark.parametrize("seed", SEEDS)
def test_calc_action_log_probs_takes_logits_or_a_model_output(seed):
    g = _gen(seed)
    logits = torch.randn(3, 10, 13, generator=g)
    seq = torch.randint(0, 13, (3, 10), generator=g)
    picked = torch.log_softmax(logits[:, :-1], -1).gather(-1, seq[:, 1:, None])[..., 0][:, -4:]
    torch.testing.assert_close(calc_action_log_probs(logits, seq, 4), picked, **TOL)  # final release
    torch.testing.assert_close(calc_action_log_probs({"logits": logits}, seq, 4), picked, **TOL)  # reference
    with pytest.raises(TypeError, match="logits"):
        calc_action_log_probs([1, 2], seq, 4)


def test_convert_to_lora_replaces_the_matching_linears():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 2)))
    x = torch.randn(3, 6)
    before = model[0](x)
    convert_to_lora(model, 6, 4, lora_rank=2, merge_weights=False)
    assert isinstance(model[0], LoraLinear) and isinstance(model[2][0], LoraLinear)
    assert type(model[2][1]) is nn.Linear  # other sizes stay
    torch.testing.assert_close(model[0](x), before, **TOL)  # B starts at zero
    with pytest.raises(ValueError, match="must be less or equal than 2"):
        convert_to_lora(model, 4, 2, lora_rank=3)


def _experience(ids, actions=3):
    b = len(ids)
    ids = torch.as_tensor(ids)
    return Experience(ids[:, None].repeat(1, 5), torch.zeros(b, actions), ids.float(), ids.float(),
                      ids.float()[:, None], torch.ones(b, 5, dtype=torch.long), torch.ones(b, actions).bool())


@pytest.mark.parametrize("cls", [NaiveReplayBuffer, NaiveExperienceBuffer])
def test_naive_buffer_keeps_the_newest_items_and_samples_without_replacement(cls):
    buffer = cls(sample_batch_size=3, limit=5)
    buffer.append(_experience([0, 1, 2, 3]))
    buffer.append(_experience([4, 5, 6]))
    assert len(buffer) == 5 and [int(buffer[i].sequences[0]) for i in range(5)] == [2, 3, 4, 5, 6]
    batch = buffer.sample()
    ids = batch.sequences[:, 0].tolist()
    assert len(set(ids)) == 3 and set(ids) <= {2, 3, 4, 5, 6}
    merged = buffer.collate_fn([buffer[0], buffer[1]])
    assert merged.sequences[:, 0].tolist() == [2, 3]
    buffer.clear()
    assert len(buffer) == 0
    with pytest.raises(ValueError, match="cannot sample 3 items"):
        buffer.sample()


def test_zero_pad_sequences_both_sides():
    rows = [torch.tensor([1, 2]), torch.tensor([3])]
    assert zero_pad_sequences(rows).tolist() == [[1, 2], [0, 3]]
    assert zero_pad_sequences(rows, side="right").tolist() == [[1, 2], [3, 0]]
    with pytest.raises(ValueError, match="side"):
        zero_pad_sequences(rows, side="middle")
