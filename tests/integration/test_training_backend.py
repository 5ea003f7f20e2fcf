"""TrainingBackend on a real ColossalAI Booster with the tiny Qwen2 on CPU: steps, names, LoRA, critic, and a
two-process data-parallel group over gloo."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from coati_relay.training.booster_backend import TrainingBackend, WarmupSchedule, load_causal_lm
from coati_relay.training.critic import CriticModel
from coati_relay.training.distributed import free_port


def _batch(seed: int = 0, n: int = 4, s: int = 24) -> torch.Tensor:
    return torch.randint(2, 300, (n, s), generator=torch.Generator().manual_seed(seed))


def _lm_step(backend: TrainingBackend, ids: torch.Tensor) -> float:
    loss = backend.model(input_ids=ids, labels=ids).loss
    backend.backward(loss)
    backend.step()
    backend.zero_grad()
    return float(loss.detach())


def _params(module: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def test_step_changes_weights_and_reduces_loss(tiny_model_path):
    backend = TrainingBackend(load_causal_lm(tiny_model_path), lr=3e-3, max_grad_norm=1.0)
    before = _params(backend.unwrapped())
    ids = _batch()
    loss0 = backend.model(input_ids=ids, labels=ids).loss
    backend.backward(loss0)
    stats = backend.step()
    backend.zero_grad()
    assert stats["lr"] == pytest.approx(3e-3) and stats["grad_norm"] > 0
    after = _params(backend.unwrapped())
    assert all(not torch.equal(before[k], after[k]) for k in before if "embed" not in k)
    losses = [float(loss0.detach())] + [_lm_step(backend, ids) for _ in range(4)]
    assert losses[-1] < losses[0] - 0.5, losses
    assert backend.plugin_name == "ddp" and isinstance(backend.optimizer.unwrap(), torch.optim.AdamW)


def test_state_dict_for_inference_has_hf_names(tiny_model_path):
    backend = TrainingBackend(load_causal_lm(tiny_model_path), lr=1e-3)
    reference = load_causal_lm(tiny_model_path).state_dict()
    state = backend.state_dict_for_inference()
    assert list(state) == list(reference)
    for k, v in state.items():
        assert v.device.type == "cpu" and v.is_contiguous() and torch.equal(v, reference[k]), k
    state["model.norm.weight"].add_(1.0)  # a copy: the live weights do not move
    assert torch.equal(backend.unwrapped().state_dict()["model.norm.weight"], reference["model.norm.weight"])
    live = backend.state_dict_for_inference(copy=False)  # what a publisher, which copies before returning, gets
    params = dict(backend.unwrapped().named_parameters())
    assert live["model.norm.weight"].data_ptr() == params["model.norm.weight"].data_ptr()


def test_lora_trains_only_adapters_and_folds_them_for_inference(tiny_model_path):
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    backend = TrainingBackend(load_causal_lm(tiny_model_path, lora=lora), lr=1e-2)
    peft_model = backend.unwrapped()
    before = _params(peft_model)
    for _ in range(2):
        _lm_step(backend, _batch())
    after = _params(peft_model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed)
    assert any(".lora_A." in k for k in changed) and any(".lora_B." in k for k in changed)

    merged = load_causal_lm(tiny_model_path)
    state = backend.state_dict_for_inference()
    assert list(state) == list(merged.state_dict())
    merged.load_state_dict(state)
    ids = _batch(1)
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_hybrid_plugin_matches_ddp_for_one_step(tiny_model_path):
    ids = _batch()
    results = {}
    for plugin in ("ddp", "hybrid"):
        backend = TrainingBackend(load_causal_lm(tiny_model_path), lr=1e-3, plugin=plugin)
        loss = _lm_step(backend, ids)
        results[plugin] = (loss, backend.state_dict_for_inference())
    assert results["ddp"][0] == pytest.approx(results["hybrid"][0], rel=1e-5)
    for k, v in results["ddp"][1].items():
        torch.testing.assert_close(results["hybrid"][1][k], v, rtol=0, atol=1e-5)


def test_warmup_cosine_schedule(tiny_model_path):
    backend = TrainingBackend(load_causal_lm(tiny_model_path), lr=1e-3, scheduler="cosine", warmup_steps=2,
                              total_steps=6, min_lr_ratio=0.1)
    used = []
    for _ in range(6):
        loss = backend.model(input_ids=_batch(), labels=_batch()).loss
        backend.backward(loss)
        used.append(backend.step()["lr"])
        backend.zero_grad()
    expected = [1e-3 * WarmupSchedule("cosine", 2, 6, 0.1)(s) for s in range(6)]
    assert used == pytest.approx(expected)
    assert expected[:2] == pytest.approx([5e-4, 1e-3]) and expected[-1] > 1e-4
    assert WarmupSchedule("cosine", 2, 6, 0.1)(0) == 0.5
    assert WarmupSchedule("constant", 0, None, 0.0)(100) == 1.0


def test_plain_torch_fallback_without_colossalai(tiny_model_path, tmp_path, monkeypatch):
    from coati_relay.training import booster_backend

    monkeypatch.setattr(booster_backend, "_colossalai_installed", lambda: False)
    backend = TrainingBackend(load_causal_lm(tiny_model_path), lr=3e-3, scheduler="constant")
    assert backend.booster is None and isinstance(backend.optimizer, torch.optim.AdamW)
    losses = [_lm_step(backend, _batch()) for _ in range(3)]
    assert losses[-1] < losses[0]
    backend.save(tmp_path)
    fresh = TrainingBackend(load_causal_lm(tiny_model_path), lr=3e-3, scheduler="constant")
    fresh.load(tmp_path)
    assert _lm_step(fresh, _batch()) == pytest.approx(_lm_step(backend, _batch()), abs=1e-6)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"lr": 0.0}, ValueError, "lr must be a positive"),
    ({"scheduler": "linear"}, ValueError, "scheduler must be"),
    ({"scheduler": "cosine"}, ValueError, "needs total_steps"),
    ({"max_grad_norm": -1.0}, ValueError, "max_grad_norm"),
    ({"plugin": "zero2"}, ValueError, "needs CUDA"),
    ({"plugin": "nope"}, ValueError, "unknown plugin"),
])
def test_bad_arguments(kwargs, error, match):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(error, match=match):
        TrainingBackend(model, **{"lr": 1e-3, **kwargs})


def test_frozen_model_and_bad_lora_are_rejected(tiny_model_path):
    with pytest.raises(ValueError, match="no parameter with requires_grad"):
        TrainingBackend(torch.nn.Linear(2, 2).requires_grad_(False), lr=1e-3)
    with pytest.raises(TypeError, match="must be an nn.Module"):
        TrainingBackend("model", lr=1e-3)
    with pytest.raises(ValueError, match="lora must be a dict"):
        load_causal_lm(tiny_model_path, lora={"rank": 4})
    with pytest.raises(ValueError, match="no config.json"):
        load_causal_lm(os.path.dirname(tiny_model_path))
    with pytest.raises(ValueError, match="'hybrid' shards transformers models only.*use plugin 'ddp'"):
        TrainingBackend(CriticModel.from_pretrained(tiny_model_path), lr=1e-3, plugin="hybrid")


def test_critic_values_padding_and_round_trip(tiny_model_path, tmp_path):
    critic = CriticModel.from_pretrained(tiny_model_path)
    lm = load_causal_lm(tiny_model_path)
    assert torch.equal(critic.base.layers[0].self_attn.q_proj.weight, lm.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(CriticModel.from_pretrained(tiny_model_path).value_head.weight, critic.value_head.weight)

    ids = _batch(n=2, s=10)
    mask = torch.ones_like(ids)
    padded_ids = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids], dim=1)
    padded_mask = torch.cat([torch.zeros(2, 3, dtype=torch.long), mask], dim=1)
    with torch.no_grad():
        values = critic(ids, mask)
        padded = critic(padded_ids, padded_mask)
    assert values.shape == (2, 10) and values.dtype == torch.float32
    torch.testing.assert_close(padded[:, 3:], values, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="same shape"):
        critic(ids, mask[:, :5])

    backend = TrainingBackend(critic, lr=3e-3)
    target = torch.full((2, 10), 0.5)
    losses = []
    for _ in range(5):
        loss = ((backend.model(ids, mask) - target) ** 2).mean()
        backend.backward(loss)
        backend.step()
        backend.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] / 2, losses
    backend.unwrapped().save_pretrained(tmp_path / "critic")
    reloaded = CriticModel.from_pretrained(tmp_path / "critic")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids, mask), backend.unwrapped()(ids, mask))


_DDP_WORKER = textwrap.dedent("""
    import sys, torch
    from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm
    from coati_relay.training.distributed import init_process_group
    from coati_relay.checkpoint import load_checkpoint, save_checkpoint
    rank, world, port, model_path, batch_file, out, run_dir = sys.argv[1:]
    init_process_group(int(rank), int(world), "127.0.0.1", int(port), timeout_s=120)
    ids = torch.load(batch_file).chunk(int(world))[int(rank)]
    backend = TrainingBackend(load_causal_lm(model_path), lr=1e-3)
    loss = backend.model(input_ids=ids, labels=ids).loss
    backend.backward(loss)
    grads = {k: p.grad.clone() for k, p in backend.unwrapped().named_parameters()}
    stats = backend.step()
    state = backend.state_dict_for_inference()
    save_checkpoint(run_dir, 1, {"actor": backend}, {"world": int(world)})
    backend.step()  # moves the weights again; the load below must bring back the saved ones on every rank
    assert load_checkpoint(run_dir, {"actor": backend}) == {"world": int(world), "step": 1}
    reloaded = backend.state_dict_for_inference()
    assert all(torch.equal(reloaded[k], v) for k, v in state.items())
    torch.save({"state": state, "grads": grads, "grad_norm": stats["grad_norm"]}, out)
""")


@pytest.mark.slow
def test_two_process_data_parallel_step_equals_one_process_on_the_whole_batch(tiny_model_path, tmp_path):
    """Each rank takes half the batch; DDP averages gradients, so (with equal halves and a loss that is a mean
    over the same number of tokens per row) one step equals a single-process step on the whole batch. Both ranks
    also save and load a checkpoint together."""
    ids = _batch(n=4, s=24)
    torch.save(ids, tmp_path / "batch.pt")
    (tmp_path / "worker.py").write_text(_DDP_WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(r), "2", str(port),
                               tiny_model_path, str(tmp_path / "batch.pt"), str(tmp_path / f"rank{r}.pt"),
                               str(tmp_path / "run")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for k, v in ranks[0]["state"].items():
        assert torch.equal(v, ranks[1]["state"][k]), f"ranks disagree on {k}"

    single = TrainingBackend(load_causal_lm(tiny_model_path), lr=1e-3)
    loss = single.model(input_ids=ids, labels=ids).loss
    single.backward(loss)
    for k, p in single.unwrapped().named_parameters():  # the all-reduced mean gradient, up to float rounding
        torch.testing.assert_close(ranks[0]["grads"][k], p.grad, rtol=1e-4, atol=1e-8, msg=k)
    stats = single.step()
    expected = single.state_dict_for_inference()
    # Adam's first step moves a weight by lr * g / (|g| + eps): where |g| is ~1e-8, float rounding of g shows in
    # the update (measured up to 3.5e-6 with lr 1e-3). atol 1e-5 is 1% of one step.
    for k, v in expected.items():
        torch.testing.assert_close(ranks[0]["state"][k], v, rtol=0, atol=1e-5, msg=k)
    assert ranks[0]["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-5)
    assert not torch.equal(expected["lm_head.weight"], load_causal_lm(tiny_model_path).state_dict()["lm_head.weight"])
    assert math.isfinite(float(loss))


def test_the_single_process_group_leaves_the_rendezvous_environment_alone(tmp_path):
    """A driver that trains in place (colocated runs, tests) holds a group of one; the processes it starts later
    must not inherit RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT pointing at the port it holds, nor a LOCAL_RANK."""
    import subprocess
    import sys

    probe = ("import os, torch.distributed as dist\n"
             "os.environ['MASTER_ADDR'] = 'user-set'\n"
             "from coati_relay.training.distributed import ensure_single_process_group\n"
             "ensure_single_process_group()\n"
             "assert dist.is_initialized() and dist.get_world_size() == 1\n"
             "print(sorted(k for k in ('RANK', 'WORLD_SIZE', 'MASTER_PORT', 'LOCAL_RANK') if k in os.environ), "
             "os.environ['MASTER_ADDR'])\n")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                                         "MASTER_PORT", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]", "user-set"]
