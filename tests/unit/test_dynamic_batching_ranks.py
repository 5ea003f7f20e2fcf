"""Dynamic batching on two gloo ranks: every rank makes as many optimizer steps as the rank with the fewest kept
groups can fill, and the other rank carries its extra groups to the next round (no rank waits in a collective the
other never joins)."""
from __future__ import annotations

from pathlib import Path

import torch
from gloo_ranks import run_ranks
from train_round_helpers import BigramLM, make_config, make_rollout, record_steps

from coati_relay.roles.consumer import ConsumerWorker

WORLD = 2
PROMPTS = [[3, 4, 5], [6]]
RESPONSES = [[1, 2, 3], [4], [5, 6], [7, 8, 9]]
REWARDS = {0: [1.0, 0.0, 0.0, 1.0], 1: [1.0, 0.0, 1.0, 1.0]}  # rank 0 keeps both groups, rank 1 the first


def _rank_main(rank: int, port: int, model: str, data: str, out_dir: str) -> None:
    from coati_relay.training.distributed import init_process_group

    torch.set_num_threads(1)
    init_process_group(rank, WORLD, "127.0.0.1", port, backend="gloo", timeout_s=120)
    cfg = make_config(model, data, consumers=WORLD, train_batch_size=1, beta=0.0, filter_range=[0.01, 0.99])
    worker = ConsumerWorker.for_models(cfg, BigramLM(), rank=rank)
    grads = record_steps(worker)
    stats = worker.train_round(make_rollout(PROMPTS, RESPONSES, 2, REWARDS[rank], policy=BigramLM()))
    carried = 0 if worker.learner._carry is None else worker.learner._carry.num_prompts
    torch.save({"steps": len(grads), "stats": stats, "carried": carried}, Path(out_dir) / f"rank{rank}.pt")


def test_ranks_step_together_and_the_richer_one_carries(tiny_model_path, tmp_path):
    from coati_relay.toy import write_toy_dataset

    data = str(write_toy_dataset(tmp_path / "p.jsonl", num_prompts=16))
    run_ranks(_rank_main, (tiny_model_path, data, str(tmp_path)), WORLD, 300)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert [g["steps"] for g in got] == [1, 1] and [g["carried"] for g in got] == [1, 0]
    assert got[0]["stats"]["carried_groups"] == got[1]["stats"]["carried_groups"] == 0.5  # averaged over ranks
