"""``DDPStrategy`` on two gloo ranks: ``setup_dataloader`` gives each rank its own batches of a buffer both ranks
hold (final release), and the checkpoint forms of both releases: an optimizer file per rank at a path per rank
(reference test) or at one shared path (final test), the model from rank 0 or from every rank, the final switch's
sharded directory, each loaded back on every rank."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent("""
    import json, os, sys, warnings
    import torch
    import torch.distributed as dist


    def run(rank, world, port, ckpt, results):
        warnings.simplefilter("ignore")
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        from transformers import GPT2Config
        from coati_compat.legacy.experience import Experience
        from coati_compat.legacy.model_families import GPTActor
        from coati_compat.legacy.replay_buffer import NaiveExperienceBuffer
        from coati_compat.legacy.strategies import DDPStrategy

        strategy = DDPStrategy()
        n = 10
        buffer = NaiveExperienceBuffer(2, cpu_offload=False)
        buffer.append(Experience(torch.arange(n * 4).view(n, 4), torch.zeros(n, 2), torch.arange(n).float(),
                                 torch.zeros(n), torch.zeros(n, 1), torch.ones(n, 4, dtype=torch.long),
                                 torch.ones(n, 2, dtype=torch.bool)))
        rows = [[int(v) for v in batch.values] for batch in strategy.setup_dataloader(buffer)]

        torch.manual_seed(0)
        actor = GPTActor(config=GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=32))
        actor, optim = strategy.prepare((actor, torch.optim.Adam(actor.parameters(), lr=1e-2)))
        strategy.backward(actor(torch.randint(0, 32, (2, 8)), 3).sum(), actor, optim)
        strategy.optimizer_step(optim)
        saved = {k: v["exp_avg"].clone() for k, v in optim.state_dict()["state"].items()}
        strategy.save_optimizer(optim, f"{ckpt}/optim-r{rank}.pt")
        strategy.save_optimizer(optim, f"{ckpt}/optim.pt")
        # Rank-distinct weights (DDP left them equal): rank r holds trained + r + 1, so a load shows whose file it read.
        params = list(strategy.unwrap_model(actor).parameters())
        with torch.no_grad():
            trained = [p.detach().clone() for p in params]
            for p in params:
                p.add_(rank + 1)
        strategy.save_model(actor, f"{ckpt}/model.pt")
        strategy.save_model(actor, f"{ckpt}/model-r{rank}.pt", only_rank0=False)
        os.environ["COATI_RELAY_LEGACY_NAMES"] = "final"
        strategy.save_optimizer(optim, f"{ckpt}/optim-final")
        del os.environ["COATI_RELAY_LEGACY_NAMES"]
        dist.barrier()
        own = torch.load(f"{ckpt}/optim-r{rank}.pt", weights_only=True)  # the legacy file: optimizer.state_dict()
        loaded = {}
        for name in (f"optim-r{rank}.pt", "optim.pt", "optim-final"):
            for state in optim.state_dict()["state"].values():
                state["exp_avg"].zero_()
            strategy.load_optimizer(optim, f"{ckpt}/{name}")
            loaded[name] = all(torch.equal(optim.state_dict()["state"][k]["exp_avg"], v) for k, v in saved.items())
        model_read = {}  # file -> the ranks whose weights the model holds after loading it (weights zeroed first)
        for name in ("model.pt", f"model-r{rank}.pt"):
            with torch.no_grad():
                for p in params:
                    p.zero_()
            strategy.load_model(actor, f"{ckpt}/{name}", strict=True)
            model_read[name] = [r for r in range(world)
                                if all(torch.equal(p, t + (r + 1)) for p, t in zip(params, trained))]
        result = dict(rows=rows, files=sorted(os.listdir(ckpt)), loaded=loaded, model_read=model_read,
                      own_file=all(torch.equal(own["state"][k]["exp_avg"], v) for k, v in saved.items()))
        dist.barrier()
        with open(f"{results}/rank{rank}.json", "w") as f:
            json.dump(result, f)


    if __name__ == "__main__":
        import torch.multiprocessing as mp

        mp.spawn(run, args=(2, int(sys.argv[1]), sys.argv[2], sys.argv[3]), nprocs=2)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    (root / "ckpt").mkdir()
    (root / "results").mkdir()
    (root / "worker.py").write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "backend"), str(REPO / "compat")])}
    proc = subprocess.run([sys.executable, str(root / "worker.py"), str(_free_port()), str(root / "ckpt"),
                           str(root / "results")], capture_output=True, text=True, env=env, timeout=480)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((root / "results" / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_each_rank_gets_its_own_batches_of_the_same_buffer(ranks):
    rows = [sum(r["rows"], []) for r in ranks]
    assert len(ranks[0]["rows"]) == len(ranks[1]["rows"]) == 2  # 5 items a rank, whole batches of 2
    assert all(len(batch) == 2 for r in ranks for batch in r["rows"])
    assert not set(rows[0]) & set(rows[1])


@pytest.mark.slow
def test_optimizer_files_per_rank_and_shared_load_back_on_every_rank(ranks):
    for result in ranks:
        assert result["own_file"]  # what the reference strategies wrote: torch.save(optimizer.state_dict())
        assert result["loaded"] == {name: True for name in result["loaded"]}
    files = ranks[0]["files"]
    assert {"optim-r0.pt", "optim-r1.pt", "optim.pt", "model.pt", "model-r0.pt", "model-r1.pt",
            "optim-final"} == set(files)  # one model.pt from rank 0; no temporary files left


@pytest.mark.slow
def test_model_files_hold_their_ranks_weights(ranks):
    """The ranks' weights differ before saving (rank r: trained + r + 1): ``model.pt`` (rank 0 writes) loads rank 0's
    weights on every rank, and ``model-r{r}.pt`` (``only_rank0=False``) loads rank r's own."""
    for rank, result in enumerate(ranks):
        assert result["model_read"] == {"model.pt": [0], f"model-r{rank}.pt": [rank]}, f"rank {rank}"
