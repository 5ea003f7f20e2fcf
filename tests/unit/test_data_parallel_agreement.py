"""Two gloo ranks that cannot complete a collective end with an error that says why, never a wait for ever
(`coati_relay.training.step_plan`, `coati_relay.training.rank_phases`), and ranks whose data differ in ways that
change the number of forwards (prompts shared by adjacent rows on one rank only) still train together."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from gloo_ranks import run_ranks
from train_round_helpers import make_config, make_rollout, record_steps

WORLD = 2
GROUP_TIMEOUT_S = 30  # the group's own timeout: a hang fails the test in this, not in gloo's 30 minutes


def _init(rank: int, port: int, collective_timeout_s: float = GROUP_TIMEOUT_S) -> None:
    from coati_relay.training.distributed import init_process_group
    from coati_relay.training.rank_phases import set_collective_timeout

    torch.set_num_threads(1)
    init_process_group(rank, WORLD, "127.0.0.1", port, backend="gloo", timeout_s=GROUP_TIMEOUT_S)
    set_collective_timeout(collective_timeout_s)


def _train_main(rank: int, port: int, cfg, model_path: str, batches, out_dir: str) -> None:
    """Trains ``batches[rank]`` on a transformers policy under DDP; saves the step gradients or the error."""
    from transformers import AutoModelForCausalLM

    from coati_relay.roles.consumer import ConsumerWorker

    _init(rank, port)
    worker = ConsumerWorker.for_models(cfg, AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
                                       rank=rank)
    grads = record_steps(worker)
    started = time.monotonic()
    try:
        worker.train_round(batches[rank])
        out = {"grads": grads, "params": [p.detach().clone() for p in worker.policy.unwrapped().parameters()]}
    except Exception as exc:  # the test reads it
        out = {"error": f"{type(exc).__name__}: {exc}"}
    out["seconds"] = time.monotonic() - started
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")


def _spawn(main, args: tuple, out_dir: Path, timeout_s: float = 240) -> list:
    run_ranks(main, (*args, str(out_dir)), WORLD, timeout_s)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


def _config(tiny_model_path, tmp_path, **over):
    from coati_relay.toy import write_toy_dataset

    data = str(write_toy_dataset(tmp_path / "p.jsonl", num_prompts=16))
    return make_config(tiny_model_path, data, core_algo="REINFORCE_PPB", consumers=WORLD, group_size=1, beta=0.0,
                       **over)


@pytest.mark.slow
def test_one_response_a_prompt_with_repeated_prompts_on_one_rank_trains(tiny_model_path, tmp_path):
    """One response a prompt, and two adjacent rows with the same prompt on rank 0 only: rank 0 could share that
    prompt's forward (two forwards) where rank 1 could not (one), and DDP broadcasts buffers in each forward, so the
    ranks waited on each other until the group's timeout. Now they run as many forwards and step together."""
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    batches = [make_rollout([[5, 9, 12, 7], [5, 9, 12, 7]], [[3, 8, 1], [40]], 1, [1.0, 0.0], policy=policy),
               make_rollout([[30, 4], [8, 19, 3]], [[6, 6], [2, 9, 4]], 1, [0.5, 0.2], policy=policy)]
    cfg = _config(tiny_model_path, tmp_path, train_batch_size=2, microbatch=2)
    ranks = _spawn(_train_main, (cfg, tiny_model_path, batches), tmp_path)
    assert all("error" not in r for r in ranks), [r.get("error") for r in ranks]
    assert [len(r["grads"]) for r in ranks] == [1, 1]
    before = list(policy.parameters())
    for a, b in zip(ranks[0]["params"], ranks[1]["params"]):
        assert torch.isfinite(a).all() and torch.equal(a, b), "the ranks' weights stay equal"
    assert any(not torch.equal(a, b.detach()) for a, b in zip(ranks[0]["params"], before)), "the weights moved"


@pytest.mark.slow
def test_ranks_that_disagree_on_a_step_end_naming_both_plans(tiny_model_path, tmp_path):
    """Rank 0 holds two optimizer steps of rows, rank 1 one: both end before the step's first backward pass, with
    an error that gives each rank's plan."""
    batches = [make_rollout([[5, 9], [30, 4], [8, 19], [17, 2]], [[3], [4], [5], [6]], 1, [1.0, 0.0, 0.5, 0.2]),
               make_rollout([[11, 12], [13, 14]], [[7], [8]], 1, [0.1, 0.9])]
    cfg = _config(tiny_model_path, tmp_path, train_batch_size=2, microbatch=2)
    ranks = _spawn(_train_main, (cfg, tiny_model_path, batches), tmp_path)
    for r in ranks:
        assert r["error"].startswith("PlanMismatch"), r.get("error")
        assert "rank 0: 1 micro-batch(es), policy trains, critic none, 2 optimizer step(s)" in r["error"]
        assert "rank 1: 1 micro-batch(es), policy trains, critic none, 1 optimizer step(s)" in r["error"]
        assert r["seconds"] < 60


def _stuck_main(rank: int, port: int, out_dir: str) -> None:
    """Rank 1 stops in its log-probs phase; rank 0's next collective (in its backward phase) gives up."""
    from coati_relay.training.distributed import all_reduce_sum
    from coati_relay.training.rank_phases import RankPhases

    _init(rank, port, collective_timeout_s=3)
    phases = RankPhases(rank, WORLD, collective_timeout_s=3, gate_timeout_s=2)
    if rank == 1:
        with phases.phase("log-probs", 4, -1):
            time.sleep(12)
        return
    started = time.monotonic()
    try:
        with phases.phase("backward", 4, 1):
            all_reduce_sum(torch.ones(3))
        out = {"error": None}
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    out["seconds"] = time.monotonic() - started
    torch.save(out, Path(out_dir) / "rank0.pt")


def test_a_stuck_rank_ends_the_step_within_the_collective_timeout_naming_phases(tmp_path):
    run_ranks(_stuck_main, (str(tmp_path),), WORLD, 120)
    got = torch.load(tmp_path / "rank0.pt")
    assert got["error"] is not None and got["error"].startswith("CollectiveTimeout"), got["error"]
    assert "consumer rank 0 of 2: a collective in phase 'backward' (round 4, step 1)" in got["error"]
    assert "rank 1 was last in phase 'log-probs' of round 4 step -1" in got["error"]
    assert "collective_timeout_s=3" in got["error"]
    assert 2.5 < got["seconds"] < 10


def _gate_main(rank: int, port: int, out_dir: str) -> None:
    """Rank 1 never reaches round 2's gate; rank 0 waits there for 2 s."""
    from coati_relay.training.rank_phases import RankPhases

    _init(rank, port)
    phases = RankPhases(rank, WORLD, collective_timeout_s=3, gate_timeout_s=2)
    if rank == 1:
        phases.gate(1)
        time.sleep(6)
        return
    phases.gate(1)
    try:
        phases.gate(2)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    torch.save({"error": error}, Path(out_dir) / "rank0.pt")


def test_the_round_gate_names_the_ranks_that_did_not_arrive(tmp_path):
    run_ranks(_gate_main, (str(tmp_path),), WORLD, 120)
    error = torch.load(tmp_path / "rank0.pt")["error"]
    assert error is not None and error.startswith("CollectiveTimeout"), error
    assert "waited 2 s (timeout_s) at the start of round 2 for ranks [1]" in error
    assert "rank 1 was last in phase 'gate' of round 1" in error
