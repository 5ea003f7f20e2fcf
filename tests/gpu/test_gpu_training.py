"""Consumer training on CUDA: the Booster with LowLevelZero (``zero2``) and Gemini over one and two NCCL ranks,
both with HybridAdam; and HybridAdam's fused CUDA step against torch's AdamW."""
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
    torch.save({"state": state, "losses": losses, "optimizer": type(backend.optimizer.unwrap()).__name__,
                "device": backend.device.type, "grad_norm": stats["grad_norm"]}, out.format(rank))
""")


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=needs_devices(2))])
@pytest.mark.parametrize("plugin", ["zero2", "gemini"])
def test_plugin_trains_on_cuda_with_hybrid_adam(tiny_model_path, tmp_path, plugin, world):
    from coati_relay.training.booster_backend import load_causal_lm

    torch.save(torch.randint(2, 300, (4, 24), generator=torch.Generator().manual_seed(0)), tmp_path / "batch.pt")
    (tmp_path / "rank.py").write_text(_RANK)
    run_ranks(tmp_path / "rank.py", world, [str(free_port()), plugin, tiny_model_path, str(tmp_path / "batch.pt"),
                                            str(tmp_path / "rank{}.pt")])
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for got in ranks:
        assert got["optimizer"] == "HybridAdam" and got["device"] == "cuda"
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
