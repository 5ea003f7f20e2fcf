"""``reinforce_ppb`` whitens its advantages over the global batch: two gloo ranks, each with half of a batch, get
the halves of what one rank holding the whole batch gets."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gloo_ranks import run_ranks

from coati_relay import algorithms as alg

pytestmark = pytest.mark.slow

WORLD = 2
TIMEOUT_S = 120
PARAMS = type("P", (), {"beta": 0.2, "kl_estimator": "k3"})


def _batch():
    """8 responses (G = 4) of unequal lengths, with behaviour and reference log-probs (a KL term)."""
    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0])
    mask = (torch.arange(5).expand(8, 5) < torch.tensor([5, 2, 3, 1, 4, 5, 2, 3]).unsqueeze(1)).float()
    logp, ref = -torch.rand(8, 5, generator=gen), -torch.rand(8, 5, generator=gen)
    return rewards, mask, logp, ref


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    from coati_relay.training.distributed import init_process_group

    torch.set_num_threads(1)
    init_process_group(rank, WORLD, "127.0.0.1", port, backend="gloo", timeout_s=60)
    rewards, mask, logp, ref = (t.chunk(WORLD)[rank] for t in _batch())
    out = alg.get("advantage", "reinforce_ppb")(alg.AdvantageInputs(rewards, 4, mask, logp, ref), PARAMS)
    torch.save(out.advantages, Path(out_dir) / f"rank{rank}.pt")


def test_two_ranks_whiten_with_the_statistics_of_the_global_batch(tmp_path):
    run_ranks(_rank_main, (str(tmp_path),), WORLD, TIMEOUT_S)
    got = torch.cat([torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)])
    rewards, mask, logp, ref = _batch()
    centred = (rewards.view(-1, 4) - rewards.view(-1, 4).mean(dim=1, keepdim=True)).reshape(-1, 1)
    folded = centred - PARAMS.beta * alg.kl_estimate(logp, ref, kind="k3")
    torch.testing.assert_close(got, alg.whiten(folded, mask))
    halves = torch.cat([alg.whiten(f, m) for f, m in zip(folded.chunk(WORLD), mask.chunk(WORLD))])
    assert not torch.allclose(got, halves), "per-rank whitening would give other advantages"
