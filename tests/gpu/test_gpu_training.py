"""Consumer training on CUDA: the Booster with LowLevelZero (``zero2``, torch's fused AdamW) and Gemini (HybridAdam)
over one and two NCCL ranks; HybridAdam's fused CUDA step against torch's AdamW; one SGD-like step of
`TrainingBackend` with several micro-batches (or two ranks) against the same plugin with one (an SGD step is linear in
the gradient, so a wrong sum shows as a wrong update, which Adam's normalised first steps hide); `train_round` with
several micro-batches a step under zero2 and Gemini against the same plugin with one; the reference model in the
training precision (KL 0 at the first step); and two consumer ranks against one holding the whole batch."""
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


# One rank of one `TrainingBackend` step on its share of a fixed batch, in ``micro`` backward calls of loss / micro.
# The optimizer is HybridAdam without moments (betas 0) and with an eps far above every gradient: its update
# lr * g / (|g| + eps) is lr / eps * g, an SGD step of 1.0 per unit gradient (Gemini takes only ColossalAI's Adams).
_SGD_STEP = textwrap.dedent("""
    import sys, torch
    from colossalai.nn.optimizer import HybridAdam
    from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm
    from coati_relay.training.distributed import init_process_group
    rank, world, port, plugin, micro, model_path, batch_file, out = sys.argv[1:]
    rank, world, micro = int(rank), int(world), int(micro)
    init_process_group(rank, world, "127.0.0.1", int(port), timeout_s=300)
    model = load_causal_lm(model_path)
    eps = 1e4
    optimizer = HybridAdam(model.parameters(), lr=1.0 * eps, betas=(0.0, 0.0), eps=eps, weight_decay=0.0)
    options = {"enable_gradient_accumulation": True} if plugin == "gemini" and micro > 1 else {}
    backend = TrainingBackend.around(model, optimizer, plugin=plugin, plugin_options=options,
                                     allow_cpu_fallback=False)
    ids = torch.load(batch_file).chunk(world)[rank].to(backend.device)
    for part in ids.chunk(micro):  # equal token counts: the mean of the parts' means is the batch's mean
        backend.backward(backend.model(input_ids=part, labels=part).loss / micro)
    backend.step()
    torch.save({"state": backend.state_dict_for_inference()}, out.format(rank))
""")


def _sgd_step(tmp_path, model_path: str, plugin: str, micro: int, world: int = 1):
    """Runs `_SGD_STEP` on ``world`` ranks over one fixed batch of 8 sequences; returns rank 0's weights."""
    run = tmp_path / f"sgd-{plugin}-{micro}-{world}"
    run.mkdir()
    torch.save(torch.randint(2, 300, (8, 24), generator=torch.Generator().manual_seed(0)), run / "batch.pt")
    (run / "step.py").write_text(_SGD_STEP)
    run_ranks(run / "step.py", world, [str(free_port()), plugin, str(micro), model_path, str(run / "batch.pt"),
                                       str(run / "rank{}.pt")])
    return torch.load(run / "rank0.pt")["state"]


SGD_TOLERANCE = 0.1  # bf16 forwards and weights on both sides; a lost or doubled micro-batch is 25% off or more


@pytest.mark.parametrize("plugin", ["zero2", "gemini"])
def test_micro_batches_sum_to_the_gradient_of_one_batch(tiny_model_path, tmp_path, plugin):
    """Gemini accumulates only with ``enable_gradient_accumulation`` (without it, 100-109% off)."""
    from coati_relay.training.booster_backend import load_causal_lm

    initial = load_causal_lm(tiny_model_path).state_dict()
    whole = _sgd_step(tmp_path, tiny_model_path, plugin, 1)
    micro = _sgd_step(tmp_path, tiny_model_path, plugin, 4)
    gap = _update_gap(initial, micro, whole)
    assert gap < SGD_TOLERANCE, f"{plugin}: 4 micro-batches are {gap:.1%} off one batch's SGD step"
    assert not non_finite(micro)


@needs_devices(2)
@pytest.mark.parametrize("plugin", ["zero2", "gemini"])
def test_two_ranks_step_as_one_holding_the_whole_batch(tiny_model_path, tmp_path, plugin):
    from coati_relay.training.booster_backend import load_causal_lm

    initial = load_causal_lm(tiny_model_path).state_dict()
    one = _sgd_step(tmp_path, tiny_model_path, plugin, 1)
    two = _sgd_step(tmp_path, tiny_model_path, plugin, 1, world=2)
    gap = _update_gap(initial, two, one)
    assert gap < SGD_TOLERANCE, f"{plugin}: two ranks are {gap:.1%} off one rank's SGD step"


# One consumer rank of `train_round`: GRPO on a fixed rollout (its share of it), two rounds, then the weights.
_ROUND = textwrap.dedent("""
    import sys, torch
    from coati_relay.assembly.build import build_run_config
    from coati_relay.roles.consumer import ConsumerWorker
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
        train_minibatch_size=prompts, train_dataset_config={"path": data, "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": model_path}, train_model_config={"path": model_path},
        generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0},
        grpo_config={"lr": 1e-3, "beta": beta, "train_microbatch_size": micro, "reward_fn_type": "toy_letter"},
        plugin_config={"plugin": plugin}, num_generations=batch.group_size, progress=False)
    reference = load_causal_lm(model_path) if beta > 0 else None
    worker = ConsumerWorker.for_models(cfg, load_causal_lm(model_path), reference=reference, rank=rank)
    stats = [worker.train_round(batch) for _ in range(2)]
    state = worker.policy.state_dict_for_inference()
    torch.save({"state": state, "stats": stats, "reference_dtype": None if reference is None else
                str(next(worker.learner.reference.parameters()).dtype)}, out.format(rank))
""")


def _rollouts(model_path: str, parts: int):
    """4 prompts x 4 responses sampled from the tiny model on the CPU (behaviour log-probs in float32), with fixed
    rewards; split into ``parts`` prompt-major shares."""
    from coati_relay.config.schema import SamplingConfig
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
    """The consumer's wiring: 16 sequences a step in 4 micro-batches of 4 against the same plugin with one (Adam,
    two rounds: the SGD test above checks the sum itself). Gemini without gradient accumulation was 100-109% off
    (it ran later micro-batches on gradients as weights)."""
    from coati_relay.training.booster_backend import load_causal_lm

    initial = load_causal_lm(tiny_model_path).state_dict()
    whole = _train_rounds(tmp_path, tiny_model_path, data, plugin, 16)
    micro = _train_rounds(tmp_path, tiny_model_path, data, plugin, 4)
    gap = _update_gap(initial, micro["state"], whole["state"])
    assert gap < 0.1, f"{plugin} with 4 micro-batches is {gap:.0%} off its update with one"
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


# One consumer step (`_optimizer_step`) on a fixed rollout under ddp on CUDA, for 1, 4 and 16 micro-batches, with the
# host syncs counted at the CUDA level: torch's sync debug mode warns at every synchronizing CUDA operation ("error"
# would stop at the first one, which counts nothing).
_SYNCS = textwrap.dedent("""
    import sys, warnings, torch
    from coati_relay.assembly.build import build_run_config
    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.roles.learner import StepRows
    from coati_relay.training.booster_backend import load_causal_lm
    from coati_relay.training.distributed import init_process_group
    rank, world, port, model_path, data, batch_file, out = sys.argv[1:]
    init_process_group(0, 1, "127.0.0.1", int(port), timeout_s=300)
    rollout = torch.load(batch_file, weights_only=False)[0]
    prompts, n, r = rollout.num_prompts, rollout.num_sequences, rollout.response_ids.size(1)
    counts = {}
    for micro in (n, 4, 1):
        cfg = build_run_config(
            num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
            inference_batch_size=prompts, inference_microbatch_size=prompts, train_batch_size=prompts,
            train_minibatch_size=prompts, train_dataset_config={"path": data, "max_length": 32, "system_prompt": ""},
            inference_model_config={"path": model_path}, train_model_config={"path": model_path},
            generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0},
            grpo_config={"lr": 1e-3, "beta": 0.0, "train_microbatch_size": micro, "reward_fn_type": "toy_letter"},
            plugin_config={"plugin": "ddp"}, num_generations=rollout.group_size, progress=False)
        worker = ConsumerWorker.for_models(cfg, load_causal_lm(model_path))
        worker.train_round(rollout)  # warm-up: kernels and allocator
        dev = worker.device
        rows = StepRows(rollout.sequences.to(dev), rollout.attention_mask.to(dev),
                        rollout.response_mask.float().to(dev), rollout.logprobs.to(dev),
                        torch.randn(n, r, generator=torch.Generator().manual_seed(0)).to(dev),
                        torch.ones(n, device=dev), None, None, None)
        for checked in (False, True):
            worker.policy.check_finite = checked
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    worker.learner.optimizer_step(rows, r)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            counts[(micro, checked)] = sum("synchroniz" in str(w.message).lower() for w in caught)
    torch.save({"counts": counts, "n": n}, out)
""")


def test_an_optimizer_step_syncs_with_the_host_as_often_whatever_its_micro_batches_on_cuda(tiny_model_path, data,
                                                                                          tmp_path):
    """Every synchronizing CUDA operation counts (not only ``Tensor.item``): the step's metrics are read once
    whatever its micro-batches; the finite checks add one sync per backward (the loss) and one per step (the
    weights), as documented in `coati_relay.training.finite_checks`."""
    torch.save(_rollouts(tiny_model_path, 1), tmp_path / "batch.pt")
    (tmp_path / "syncs.py").write_text(_SYNCS)
    run_ranks(tmp_path / "syncs.py", 1, [str(free_port()), tiny_model_path, str(data), str(tmp_path / "batch.pt"),
                                         str(tmp_path / "counts.pt")])
    record = torch.load(tmp_path / "counts.pt")
    counts, n = record["counts"], record["n"]
    unchecked = {micro: counts[(micro, False)] for micro in (n, 4, 1)}
    assert unchecked[n] > 0, "no sync counted at all: the counter does not see the step's one read"
    assert len(set(unchecked.values())) == 1, f"host syncs per step by micro-batch size: {unchecked}"
    by_checks = {micro: counts[(micro, True)] - unchecked[micro] - n // micro for micro in (n, 4, 1)}
    assert len(set(by_checks.values())) == 1, f"the finite checks' syncs beyond one a backward: {by_checks}"
