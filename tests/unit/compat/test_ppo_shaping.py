"""The legacy maker's KL-shaped reward and advantage (coati_compat.legacy.ppo_shaping), computed by hand."""
from __future__ import annotations

import pytest
import torch

from coati_compat.legacy.ppo_shaping import legacy_advantage, legacy_kl_shaped_reward

T = torch.tensor
LOGP = T([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
REF = T([[-1.5, -1.0, -3.0], [-0.5, -1.5, -9.0]])
AMASK = T([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def close(actual, expected):
    torch.testing.assert_close(actual, T(expected, dtype=actual.dtype), rtol=1e-5, atol=1e-6)


def test_legacy_advantage():
    out = legacy_advantage(T([1.0, 2.0]), T([0.5, 3.0]))
    close(out, [[0.5], [-1.0]])
    with pytest.raises(ValueError, match=r"\[B\]"):
        legacy_advantage(T([[1.0]]), T([[1.0]]))


def test_legacy_kl_shaped_reward_by_hand():
    # k3 row 0: (e^-0.5 - 0.5, e - 2, 0), mean 0.2749375; row 1: (0, e^-1), mean 0.1839397 (masked third token)
    out = legacy_kl_shaped_reward(T([1.0, 2.0]), LOGP, REF, AMASK, kl_coef=0.1)
    close(out, [0.9725063, 1.9816060])
    r = T([1.0, 2.0])
    assert legacy_kl_shaped_reward(r, LOGP, REF, AMASK, kl_coef=0.0) is r
