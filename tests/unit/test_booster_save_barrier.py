"""`booster_save` under a checkpoint IO whose save is a collective (Gemini's, LowLevelZero's): only rank 0 writes
and renames the file, and every rank returns after that rename, so a load right after the save finds the file on
any rank. Shown on two gloo ranks with an IO of that kind whose rank 0 is slow to write."""
from __future__ import annotations

import os
import time

from gloo_ranks import run_ranks


def _rank_main(rank: int, port: int, directory: str) -> None:
    import torch.distributed as dist
    from colossalai.booster.plugin.gemini_plugin import GeminiCheckpointIO

    from coati_relay.training.checkpoint_files import booster_save

    class SlowRankZeroIO(GeminiCheckpointIO):
        """Gathers to rank 0 (stood for by a barrier), which then writes for a second."""

        def save_model(self, model, path, shard=False, **kwargs):
            dist.barrier()
            if rank == 0:
                time.sleep(1.0)
                with open(path, "w") as f:
                    f.write("weights")

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        path = os.path.join(directory, "model.pt")
        booster_save(SlowRankZeroIO(), "model", object(), path, shard=False)
        if not os.path.isfile(path):
            raise AssertionError(f"rank {rank} returned from booster_save before rank 0 renamed {path}")
    finally:
        dist.destroy_process_group()


def test_every_rank_returns_after_rank_zero_renamed_the_gathered_file(tmp_path):
    run_ranks(_rank_main, (str(tmp_path),), world=2, timeout_s=120)
    assert (tmp_path / "model.pt").read_text() == "weights"


def test_only_collective_saves_wait_and_a_booster_is_read_through_its_checkpoint_io():
    """A legacy script may save the model from rank 0 alone under DDP or LowLevelZero (ZeRO-2 keeps whole
    parameters): a wait there would never end. Gemini's saves and LowLevelZero's optimizer save gather on every
    rank. ``booster_save`` is handed a Booster, which holds its plugin's IO."""
    from types import SimpleNamespace

    from colossalai.booster.plugin.gemini_plugin import GeminiCheckpointIO
    from colossalai.booster.plugin.low_level_zero_plugin import LowLevelZeroCheckpointIO
    from colossalai.booster.plugin.torch_ddp_plugin import TorchDDPCheckpointIO

    from coati_relay.training.checkpoint_files import gathers_on_every_rank

    def booster(io_class):
        return SimpleNamespace(checkpoint_io=io_class.__new__(io_class))  # no process group needed to ask

    assert not gathers_on_every_rank(booster(TorchDDPCheckpointIO), "model")
    assert not gathers_on_every_rank(booster(TorchDDPCheckpointIO), "optimizer")
    assert not gathers_on_every_rank(booster(LowLevelZeroCheckpointIO), "model")
    assert gathers_on_every_rank(booster(LowLevelZeroCheckpointIO), "optimizer")
    assert gathers_on_every_rank(booster(GeminiCheckpointIO), "model")
    assert gathers_on_every_rank(GeminiCheckpointIO.__new__(GeminiCheckpointIO), "optimizer")
