"""Level 1 of the equivalence: the shims' functions against the reference (coati_compat.reference), fp32 on CPU,
seeded, parametrised shapes, rtol=1e-5 and atol=1e-6. Where the shims fix a legacy bug, the test shows both."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from coati_compat.legacy.experience import Experience, make_experience_batch, split_experience_batch
from coati_compat.legacy.lora import LoRAConstructor, LoraLinear, convert_to_lora_module
from coati_compat.legacy.losses import PolicyLoss, ValueLoss
from coati_compat.legacy.ppo_shaping import legacy_advantage
from coati_compat.legacy.ray_utils import get_receivers_per_sender, state_dict_to
from coati_compat.legacy.rl_functions import compute_reward
from coati_compat.reference import experience as ref_exp
from coati_compat.reference import lora as ref_lora
from coati_compat.reference import losses as ref_losses
from coati_compat.reference import ray_helpers as ref_ray

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

REPO = Path(__file__).resolve().parents[2]
TOL = dict(rtol=1e-5, atol=1e-6)
SHAPES = [(1, 1), (3, 5), (8, 17), (32, 64)]
SEEDS = [0, 1]


def _inputs(batch: int, actions: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(batch, actions, generator=g) * 3
    old_logp = logp + 0.3 * torch.randn(batch, actions, generator=g)
    adv = torch.randn(batch, 1, generator=g)
    mask = torch.rand(batch, actions, generator=g) > 0.3
    mask[:, -1] = True
    return g, logp, old_logp, adv, mask


@pytest.mark.parametrize("batch,actions", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("clip", [0.1, 0.2])
def test_policy_loss(batch, actions, seed, masked, clip):
    _, logp, old_logp, adv, mask = _inputs(batch, actions, seed)
    mask = mask if masked else None
    logp.requires_grad_(True)
    ours = PolicyLoss(clip)(logp, old_logp, adv, mask)
    (grad_ours,) = torch.autograd.grad(ours, logp)
    ref = ref_losses.policy_loss(logp, old_logp, adv, mask, clip)
    (grad_ref,) = torch.autograd.grad(ref, logp)
    torch.testing.assert_close(ours, ref, **TOL)
    torch.testing.assert_close(grad_ours, grad_ref, **TOL)


@pytest.mark.parametrize("batch", [1, 4, 33])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("clip", [0.2, 0.4])
def test_value_loss(batch, seed, clip):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(batch, generator=g, requires_grad=True)
    old_values = values.detach() + 0.5 * torch.randn(batch, generator=g)
    reward = torch.randn(batch, generator=g)
    mask = torch.rand(batch, 3, generator=g) > 0.5
    ours = ValueLoss(clip)(values, old_values, reward, mask)
    ref = ref_losses.value_loss(values, old_values, reward, mask, clip)
    torch.testing.assert_close(ours, ref, **TOL)
    torch.testing.assert_close(torch.autograd.grad(ours, values)[0], torch.autograd.grad(ref, values)[0], **TOL)


@pytest.mark.parametrize("batch,actions", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kl_coef", [0.0, 0.1, 0.5])
def test_kl_shaped_reward_and_advantage(batch, actions, seed, kl_coef):
    g, logp, base_logp, _, mask = _inputs(batch, actions, seed)
    r = torch.randn(batch, generator=g)
    value = torch.randn(batch, generator=g)
    ours = compute_reward(r, kl_coef, logp, base_logp, mask)
    ref = ref_exp.kl_shaped_reward(r, kl_coef, logp, base_logp, mask)
    torch.testing.assert_close(ours, ref, **TOL)
    torch.testing.assert_close(legacy_advantage(ours, value), ref_exp.advantage(ref, value), **TOL)
    assert legacy_advantage(ours, value).shape == (batch, 1)


def test_kl_direction_follows_the_final_legacy_release():
    _, logp, base_logp, _, mask = _inputs(8, 12, 0)
    r = torch.zeros(8)
    ours = compute_reward(r, 0.1, logp, base_logp, mask)
    reference_commit = ref_exp.kl_shaped_reward(r, 0.1, logp, base_logp, mask, kl_direction="actor_minus_base")
    assert not torch.allclose(ours, reference_commit, **TOL)


def _experience(batch: int, seq_len: int, actions: int, seed: int) -> Experience:
    g = torch.Generator().manual_seed(seed)
    return Experience(
        sequences=torch.randint(0, 50, (batch, seq_len), generator=g),
        action_log_probs=-torch.rand(batch, actions, generator=g),
        values=torch.randn(batch, generator=g),
        reward=torch.randn(batch, generator=g),
        advantages=torch.randn(batch, 1, generator=g),
        attention_mask=(torch.rand(batch, seq_len, generator=g) > 0.2).long(),
        action_mask=torch.rand(batch, actions, generator=g) > 0.3,
    )


def _as_dict(exp: Experience) -> dict:
    return {k: getattr(exp, k) for k in ref_exp.FIELDS}


def _assert_same_batch(ours: Experience, ref: dict) -> None:
    for key in ref_exp.FIELDS:
        got, want = getattr(ours, key), ref[key]
        assert got.dtype == want.dtype, key
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("batch,seq_len,actions", [(1, 4, 1), (5, 12, 6), (16, 40, 25)])
@pytest.mark.parametrize("seed", SEEDS)
def test_split_and_merge_round_trip(batch, seq_len, actions, seed):
    exp = _experience(batch, seq_len, actions, seed)
    ours_items = split_experience_batch(exp)
    ref_items = ref_exp.split_batch(_as_dict(exp))
    assert len(ours_items) == len(ref_items) == batch
    for item, ref_item in zip(ours_items, ref_items):
        for key in ref_exp.FIELDS:
            torch.testing.assert_close(getattr(item, key), ref_item[key], **TOL)
    _assert_same_batch(make_experience_batch(ours_items), ref_exp.merge_items(ref_items))
    _assert_same_batch(make_experience_batch(ours_items), _as_dict(exp))


@pytest.mark.parametrize("actions_a,actions_b", [(3, 7), (9, 2), (5, 5)])
@pytest.mark.parametrize("seed", SEEDS)
def test_merge_left_pads_log_probs_and_action_mask(actions_a, actions_b, seed):
    items = (split_experience_batch(_experience(3, 12, actions_a, seed))
             + split_experience_batch(_experience(2, 12, actions_b, seed + 10)))
    ref_items = [{k: getattr(item, k) for k in ref_exp.FIELDS} for item in items]
    ours = make_experience_batch(items)
    _assert_same_batch(ours, ref_exp.merge_items(ref_items))
    width = max(actions_a, actions_b)
    assert ours.action_log_probs.shape == (5, width)
    short = 0 if actions_a < actions_b else 3
    pad = width - min(actions_a, actions_b)
    assert not ours.action_mask[short, :pad].any() and (ours.action_log_probs[short, :pad] == 0).all()


def test_merge_of_different_sequence_lengths_is_a_clear_error():
    items = split_experience_batch(_experience(2, 10, 4, 0)) + split_experience_batch(_experience(2, 11, 4, 1))
    with pytest.raises(RuntimeError):
        ref_exp.merge_items([{k: getattr(i, k) for k in ref_exp.FIELDS} for i in items])
    with pytest.raises(ValueError, match="sequences of shapes"):
        make_experience_batch(items)


def _lora_models(seed: int, rank: int, alpha: int):
    """A trainer MLP with LoRA layers (one fan_in_fan_out) and a maker copy of its dense base weights."""
    torch.manual_seed(seed)
    trainer = nn.Sequential(nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 6))
    base = torch.randn(8, 6)  # [out, in]; fan_in_fan_out stores it as [in, out], as GPT-2's Conv1D does
    maker = nn.Sequential(nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 6),
                          LoraLinear(nn.Parameter(base.clone()), None, r=0, fan_in_fan_out=True))
    maker[:3].load_state_dict(trainer.state_dict())
    convert_to_lora_module(trainer, rank)
    for layer in (trainer[0], trainer[2]):
        layer.lora_alpha, layer.scaling = alpha, alpha / rank
    trainer.append(LoraLinear(nn.Parameter(base.clone()), None, r=rank, lora_alpha=alpha, fan_in_fan_out=True))
    return trainer, maker


def _train_lora(trainer: nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for name, param in trainer.named_parameters():
            if "lora_" in name:
                param.add_(0.3 * torch.randn(param.shape, generator=generator))


def _push(trainer: nn.Module, maker: nn.Module, ref_weights: dict, constructor: LoRAConstructor) -> dict:
    lora_sd, _ = LoRAConstructor.filter_state_dict_lora(trainer.state_dict())
    configs = LoRAConstructor.extract_lora_config(trainer)
    LoRAConstructor.load_state_dict_increase(maker, constructor.reconstruct_increase(lora_sd, configs))
    ref_configs = {k: (c.r, c.lora_alpha, c.fan_in_fan_out) for k, c in configs.items()}
    return ref_lora.push_lora(ref_weights, lora_sd, ref_configs)


@pytest.mark.parametrize("rank,alpha", [(1, 1), (2, 4), (4, 16)])
@pytest.mark.parametrize("seed", SEEDS)
def test_lora_reconstruction_one_sync_agrees(rank, alpha, seed):
    trainer, maker = _lora_models(seed, rank, alpha)
    _train_lora(trainer, torch.Generator().manual_seed(seed))
    ref_weights = _push(trainer, maker, {k: v.clone() for k, v in maker.state_dict().items()}, LoRAConstructor())
    for key, value in maker.state_dict().items():
        torch.testing.assert_close(value, ref_weights[key], **TOL)
    x = torch.randn(5, 12)
    torch.testing.assert_close(maker(x), trainer(x), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_lora_second_sync_replaces_where_the_legacy_accumulates(seed):
    trainer, maker = _lora_models(seed, 2, 4)
    w0 = {k: v.clone() for k, v in maker.state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    constructor = LoRAConstructor()
    _train_lora(trainer, g)
    ref_weights = _push(trainer, maker, w0, constructor)
    _train_lora(trainer, g)
    ref_weights = _push(trainer, maker, ref_weights, constructor)
    lora_sd, _ = LoRAConstructor.filter_state_dict_lora(trainer.state_dict())
    configs = {k: (c.r, c.lora_alpha, c.fan_in_fan_out)
               for k, c in LoRAConstructor.extract_lora_config(trainer).items()}
    one_push_from_w0 = ref_lora.push_lora(w0, lora_sd, configs)
    for key in ("0.weight", "2.weight", "3.weight"):
        torch.testing.assert_close(maker.state_dict()[key], one_push_from_w0[key], **TOL)
        assert not torch.allclose(ref_weights[key], one_push_from_w0[key], **TOL)
    x = torch.randn(5, 12)
    torch.testing.assert_close(maker(x), trainer(x), **TOL)


def test_lora_base_is_recaptured_after_a_full_load():
    trainer, maker = _lora_models(0, 2, 4)
    constructor = LoRAConstructor()
    g = torch.Generator().manual_seed(0)
    _train_lora(trainer, g)
    _push(trainer, maker, maker.state_dict(), constructor)
    new_dense = {k: torch.randn_like(v) for k, v in maker.state_dict().items()}
    maker.load_state_dict(new_dense)
    _train_lora(trainer, g)
    expected = _push(trainer, maker, new_dense, constructor)
    for key, value in maker.state_dict().items():
        torch.testing.assert_close(value, expected[key], **TOL)


@pytest.mark.parametrize("num_senders,num_receivers,allow_idle",
                         list(itertools.product(range(1, 6), range(1, 6), [False, True])))
def test_get_receivers_per_sender(num_senders, num_receivers, allow_idle):
    for sender in range(num_senders):
        assert (get_receivers_per_sender(sender, num_senders, num_receivers, allow_idle)
                == ref_ray.get_receivers_per_sender(sender, num_senders, num_receivers, allow_idle))


@pytest.mark.parametrize("seed", SEEDS)
def test_state_dict_to(seed):
    g = torch.Generator().manual_seed(seed)
    sd = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g, dtype=torch.float64),
          "steps": torch.tensor([3, 70000]), "ids": torch.arange(5), "flag": torch.tensor([True, False])}
    ours, ref = state_dict_to(sd), ref_ray.state_dict_to(sd)
    for key in ("w", "b"):
        assert ours[key].dtype == ref[key].dtype == torch.float16
        torch.testing.assert_close(ours[key], ref[key], **TOL)
    for key in ("steps", "ids", "flag"):
        assert ours[key].dtype == sd[key].dtype and torch.equal(ours[key], sd[key])
        assert ref[key].dtype == torch.float16
    assert torch.isinf(ref["steps"][1])  # the legacy cast overflows integer buffers
    assert list(ours) == list(sd) and sd["w"].dtype == torch.float32



def test_reference_imports_neither_the_engine_nor_the_shims():
    code = ("import json, sys, coati_compat.reference.experience, coati_compat.reference.lora, "
            "coati_compat.reference.losses, coati_compat.reference.orchestration, coati_compat.reference.ray_helpers, "
            "coati_compat.reference.replay_buffer, coati_compat.reference.training; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('coati_relay', 'coati_compat.legacy', "
            "'coati_compat.shims', 'coati.')))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("backend", "compat"))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
