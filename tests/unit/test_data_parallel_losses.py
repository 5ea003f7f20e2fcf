"""Two gloo ranks holding unequal token counts and unequal kept samples (DAPO's filters) compute, through
`ConsumerWorker.train_round`, the gradient (and loss) of one rank holding the whole batch: token-level and
sample-level aggregation, micro-batches of 1 and 2 rows, off-policy rows (clipping active), a KL term."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gloo_ranks import run_ranks
from train_round_helpers import BigramLM, make_config, make_rollout, record_steps

from coati_relay.roles.consumer import ConsumerWorker
from coati_relay.rollout import Rollout

pytestmark = pytest.mark.slow

WORLD = 2
TIMEOUT_S = 240


def _batches():
    """Rank 0 keeps all 4 rows (8 tokens); rank 1 drops group 0 (mean reward 0) and, under
    filter_truncated_response, row 3 (4 tokens = max_new_tokens)."""
    policy = BigramLM()
    rank0 = make_rollout([[3, 4, 5], [6]], [[1, 2, 3], [4], [5, 6], [7, 8, 9]], 2, [1.0, 0.0, 0.5, 0.0],
                         policy=policy, logprob_shift=0.3)
    rank1 = make_rollout([[7, 8], [9, 10]], [[2, 2], [3, 11], [5], [6, 7, 8, 9]], 2, [0.0, 0.0, 1.0, 0.0],
                         policy=policy, logprob_shift=-0.3)
    return [rank0, rank1]


def _settings():
    """(core_algo, grpo_config) pairs: DAPO token-level with both filters; GRPO sample-level with a KL term."""
    return [("DAPO", {"microbatch": 1, "dynamic_batching": False}),
            ("GRPO", {"microbatch": 2, "beta": 0.1, "filter_range": [0.01, 0.99], "dynamic_batching": False})]


def _train(cfg, batch: Rollout, rank: int = 0) -> dict:
    reference = BigramLM(seed=1) if cfg.algo.beta > 0 else None
    worker = ConsumerWorker.for_models(cfg, BigramLM(), reference=reference, rank=rank)
    grads = record_steps(worker)
    stats = worker.train_round(batch)
    return {"grads": grads, "stats": stats}


def _rank_main(rank: int, port: int, configs, batches, out_dir: str) -> None:
    from coati_relay.training.distributed import init_process_group

    torch.set_num_threads(1)
    init_process_group(rank, WORLD, "127.0.0.1", port, backend="gloo", timeout_s=120)
    torch.save([_train(cfg, batches[rank], rank) for cfg in configs], Path(out_dir) / f"rank{rank}.pt")


def _spawn(configs, batches, out_dir: Path) -> list:
    run_ranks(_rank_main, (configs, batches, str(out_dir)), WORLD, TIMEOUT_S)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


def test_two_ranks_compute_the_gradient_of_one_rank_holding_the_whole_batch(tiny_model_path, tmp_path):
    from coati_relay.toy import write_toy_dataset

    data = str(write_toy_dataset(tmp_path / "p.jsonl", num_prompts=16))
    batches = _batches()
    # Each rank: 2 prompts per optimizer step, one step. One rank: the same 4 prompts in one step.
    ranked = [make_config(tiny_model_path, data, algo, consumers=WORLD, train_batch_size=2, **kw)
              for algo, kw in _settings()]
    single = [make_config(tiny_model_path, data, algo, consumers=1, train_batch_size=4, **kw)
              for algo, kw in _settings()]
    ranks = _spawn(ranked, batches, tmp_path)
    whole = Rollout.concat(batches, pad_token_id=0)
    for i, cfg in enumerate(single):
        expected = _train(cfg, whole)
        got = [ranks[r][i] for r in range(WORLD)]
        name = cfg.core_algo
        assert len(expected["grads"]) == 1 and [len(g["grads"]) for g in got] == [1, 1], name
        want = expected["grads"][0]["table"]
        assert want.abs().max() > 1e-3, f"{name}: a gradient of zero would prove nothing"
        for r in range(WORLD):
            torch.testing.assert_close(got[r]["grads"][0]["table"], want, rtol=1e-5, atol=1e-7, msg=f"{name} r{r}")
        for key in ("loss", "kept_fraction", "clip_frac"):
            assert got[0]["stats"][key] == pytest.approx(expected["stats"][key], rel=1e-5), f"{name} {key}"
    assert expected["stats"]["kl"] > 0 and ranks[0][0]["stats"]["kept_fraction"] == pytest.approx(5 / 8)
