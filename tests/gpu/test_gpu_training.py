"""Consumer training on CUDA: the Booster with LowLevelZero (``zero2``, torch's fused AdamW) and Gemini (HybridAdam)
over one and two NCCL ranks; HybridAdam's fused CUDA step against torch's AdamW; `train_round` with several
micro-batches a step under zero2 and Gemini against DDP with one; the reference model in the training precision (KL 0
at the first step); and two consumer ranks against one holding the whole batch."""
from __future__ import annotations

import textwrap

import pytest
import torch
from gpu_lane import MARKS, changed_fraction, needs_devices, non_finite, run_ranks

from coati_relay.training.distributed import free_port

pytestmark = MARKS

# One consumer rank: its share of a fixed batch, four optimizer steps, then the weights as producers get them.
_RANK = textwrap.dedent("""
    import sys, torch
    from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm
    from coati_relay.training.distributed import init_process_group
    rank, world, port, plugin, model_path, batch_file, out = sys.argv[1:]
    rank, world = int(rank), int(world)
    init_process_group(rank, world, "127.0.0.1", int(port), timeout_s=300)
    assert torch.distributed.get_backend() == "nccl", torch.distributed.get_backend()
    backend = TrainingBackend(load_causal_lm(model_path), lr=1e-2, plugin=plugin)
    ids = torch.load(batch_file).chunk(world)[rank].to(backend.device)
    losses = []
    for _ in range(4):
        loss = backend.model(input_ids=ids, labels=ids).loss
        backend.backward(loss)
        stats = backend.step()
        backend.zero_grad()
        losses.append(float(loss.detach()))
    state = backend.state_dict_for_inference()  # every rank: a collective under Gemini
    inner = backend.optimizer.unwrap()
    torch.save({"state": state, "losses": losses, "optimizer": type(inner).__name__,
                "fused": bool(inner.defaults.get("fused")), "device": backend.device.type,
                "grad_norm": stats["grad_norm"]}, out.format(rank))
""")


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=needs_devices(2))])
@pytest.mark.parametrize("plugin", ["zero2", "gemini"])
def test_plugin_trains_on_cuda(tiny_model_path, tmp_path, plugin, world):
    from coati_relay.training.booster_backend import load_causal_lm

    torch.save(torch.randint(2, 300, (4, 24), generator=torch.Generator().manual_seed(0)), tmp_path / "batch.pt")
    (tmp_path / "rank.py").write_text(_RANK)
    run_ranks(tmp_path / "rank.py", world, [str(free_port()), plugin, tiny_model_path, str(tmp_path / "batch.pt"),
                                            str(tmp_path / "rank{}.pt")])
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    expected = {"zero2": ("AdamW", True), "gemini": ("HybridAdam", False)}[plugin]  # no kernel build for zero2
    for got in ranks:
        assert (got["optimizer"], got["fused"]) == expected and got["device"] == "cuda"
        assert not non_finite(got["state"]), non_finite(got["state"])
        assert got["losses"][-1] < got["losses"][0], got["losses"]
        assert got["grad_norm"] is None or 0 < got["grad_norm"] < float("inf"), got["grad_norm"]  # None: not reported
    initial = load_causal_lm(tiny_model_path).state_dict()
    assert changed_fraction(initial, ranks[0]["state"]) > 0.9, "the steps moved the weights"
    for other in ranks[1:]:
        for k, v in ranks[0]["state"].items():
            assert torch.equal(v, other["state"][k]), f"ranks disagree on {k}"


def test_hybrid_adam_matches_torch_adamw_on_cuda():
    from colossalai.nn.optimizer import HybridAdam

    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(64, 32, generator=gen), torch.randn(32, generator=gen)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(3)]
    results = []
    for make in (lambda ps: HybridAdam(ps, lr=1e-2, weight_decay=0.1, adamw_mode=True),
                 lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)):
        params = [torch.nn.Parameter(p.clone().cuda()) for p in start]
        opt = make(params)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.cuda()
            opt.step()
        results.append([p.detach().cpu() for p in params])
    for fused, reference, initial in zip(*results, start):
        torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)
        assert not torch.equal(fused, initial)


# One consumer rank of `train_round`: GRPO on a fixed rollout (its share of it), two rounds, then the weights.
_ROUND = textwrap.dedent("""
    import sys, torch
    from coati_relay.config import build_run_config
    from coati_relay.consumer import ConsumerWorker
    from coati_relay.training.booster_backend import load_causal_lm
    from coati_relay.training.distributed import init_process_group
    rank, world, port, plugin, micro, beta, model_path, data, batch_file, out = sys.argv[1:]
    rank, world, micro, beta = int(rank), int(world), int(micro), float(beta)
    init_process_group(rank, world, "127.0.0.1", int(port), timeout_s=300)
    batch = torch.load(batch_file, weights_only=False)[rank]
    prompts = batch.num_prompts
    cfg = build_run_config(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=world, num_episodes=1,
        inference_batch_size=prompts * world, inference_microbatch_size=prompts, train_batch_size=prompts,
        train_minibatch_size=prompts, train_dataset_config={"path": data, "max_length": 32},
        inference_model_config={"path": model_path}, train_model_config={"path": model_path},
        generate_config={"max_new_tokens": 8}, grpo_config={"lr": 1e-3, "beta": beta, "train_microbatch_size": micro},
        plugin_config={"plugin": plugin}, num_generations=batch.group_size, progress=False)
    reference = load_causal_lm(model_path) if beta > 0 else None
    worker = ConsumerWorker.for_models(cfg, load_causal_lm(model_path), reference=reference, rank=rank)
    stats = [worker.train_round(batch) for _ in range(2)]
    state = worker.policy.state_dict_for_inference()
    torch.save({"state": state, "stats": stats, "reference_dtype": None if reference is None else
                str(next(worker.reference.parameters()).dtype)}, out.format(rank))
""")


def _rollouts(model_path: str, parts: int):
    """4 prompts x 4 responses sampled from the tiny model on the CPU (behaviour log-probs in float32), with fixed
    rewards; split into ``parts`` prompt-major shares."""
    from coati_relay.inference import SamplingConfig
    from coati_relay.inference.transformers_backend import TransformersBackend

    backend = TransformersBackend(model_path, SamplingConfig(max_new_tokens=8, temperature=1.0, seed=0),
                                  device="cpu")
    prompts = [[3, 40, 41, 42], [7, 8, 9], [10, 20, 30, 40, 50], [100, 101]]
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    share = len(prompts) // parts
    out = []
    for i in range(parts):
        rollout = backend.generate(prompts[i * share:(i + 1) * share], 4)
        rollout.rewards = rewards[i * share * 4:(i + 1) * share * 4]
        out.append(rollout)
    return out


def _train_rounds(tmp_path, tiny_model_path, data, plugin: str, micro: int, world: int = 1, beta: float = 0.0):
    """Runs `_ROUND` on ``world`` ranks; returns rank 0's record."""
    run = tmp_path / f"{plugin}-{micro}-{world}-{beta}"
    run.mkdir()
    torch.save(_rollouts(tiny_model_path, world), run / "batch.pt")
    (run / "round.py").write_text(_ROUND)
    run_ranks(run / "round.py", world, [str(free_port()), plugin, str(micro), str(beta), tiny_model_path, str(data),
                                        str(run / "batch.pt"), str(run / "rank{}.pt")])
    return torch.load(run / "rank0.pt", weights_only=False)


def _update_gap(initial, a, b) -> float:
    """|update_a - update_b| / |update_b| over all weights (compared in float32)."""
    num = den = 0.0
    for k, w0 in initial.items():
        da, db = a[k].float() - w0.float(), b[k].float() - w0.float()
        num += float((da - db).pow(2).sum())
        den += float(db.pow(2).sum())
    assert den > 0, "the reference run did not move the weights"
    return (num / den) ** 0.5


@pytest.mark.parametrize("plugin", ["zero2", "gemini"])
def test_micro_batches_accumulate_to_the_update_of_one_batch(tiny_model_path, data, tmp_path, plugin):
    """16 sequences a step in 4 micro-batches of 4 under ``plugin`` (bf16) against DDP (fp32) with one: the same
    update up to bf16 rounding. Gemini without gradient accumulation was 100-109% off (it ran later micro-batches on
    gradients as weights)."""
    from coati_relay.training.booster_backend import load_causal_lm

    initial = load_causal_lm(tiny_model_path).state_dict()
    whole = _train_rounds(tmp_path, tiny_model_path, data, "ddp", 16)
    micro = _train_rounds(tmp_path, tiny_model_path, data, plugin, 4)
    gap = _update_gap(initial, micro["state"], whole["state"])
    assert gap < 0.25, f"{plugin} with 4 micro-batches is {gap:.0%} off DDP's update"
    assert not non_finite(micro["state"])


def test_the_reference_computes_in_the_training_precision(tiny_model_path, data, tmp_path):
    """zero2 trains in bf16: a bf16 reference gives a KL of 0 at the first step (a float32 one would not)."""
    record = _train_rounds(tmp_path, tiny_model_path, data, "zero2", 16, beta=0.1)
    assert record["reference_dtype"] == "torch.bfloat16"
    assert abs(record["stats"][0]["kl"]) < 1e-4, record["stats"][0]["kl"]


@needs_devices(2)
def test_two_consumer_ranks_update_as_one_holding_the_whole_batch(tiny_model_path, data, tmp_path):
    from coati_relay.training.booster_backend import load_causal_lm

    initial = load_causal_lm(tiny_model_path).state_dict()
    one = _train_rounds(tmp_path, tiny_model_path, data, "zero2", 4)
    two = _train_rounds(tmp_path, tiny_model_path, data, "zero2", 4, world=2)
    gap = _update_gap(initial, two["state"], one["state"])
    assert gap < 0.1, f"two ranks are {gap:.0%} off one rank's update"
