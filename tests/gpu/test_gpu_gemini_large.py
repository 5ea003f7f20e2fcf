"""Gemini above its keep-gathered size on CUDA: a 41M-parameter tied GPT-2 (past ``min_chunk_size_m``, 32 Mi elements),
whose chunks Gemini scatters and frees between its hooks. Through a legacy Gemini strategy: it trains, round-trips
through ``save_model`` / ``load_model`` (the tied ``lm_head`` alias folds), and refuses ``generate``,
``save_pretrained`` and a second backward before the step. Through `TrainingBackend` with the per-step check on: it
trains, resumes strictly from its own checkpoint, and refuses a second backward before the step."""
from __future__ import annotations

import json
import textwrap

import torch
from gpu_lane import MARKS, non_finite, run_ranks

from coati_relay.training.distributed import free_port

pytestmark = MARKS

CONFIG = "GPT2Config(n_layer=8, n_embd=512, n_head=8, vocab_size=32000, n_positions=128)"  # 41.6M parameters

_LEGACY = textwrap.dedent(f"""
    import json, os, sys, torch
    rank, world, port, cls, kwargs, out = sys.argv[1:]
    os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    from coati.models.gpt import GPTActor
    from coati.trainer import strategies
    from colossalai.nn.optimizer import HybridAdam
    from transformers import GPT2Config
    from coati_relay.training.gemini_guards import releases_parameters

    def weights(strategy, actor):
        return {{k: v.detach().cpu().clone() for k, v in next(strategy.get_model_state_dict_shard(actor)).items()}}

    def refusal(call):  # what the call raised (any error, named, so that a failure shows what it was)
        try:
            call()
        except Exception as exc:
            return f"{{type(exc).__name__}}: {{exc}}"
        return None

    strategy = getattr(strategies, cls)(**json.loads(kwargs))
    config = {CONFIG}
    torch.manual_seed(0)
    actor = GPTActor(config=config).to(torch.cuda.current_device())
    numel = sum(p.numel() for p in actor.parameters())
    initial = {{k: v.detach().cpu().clone() for k, v in actor.model.state_dict().items()}}
    optimizer = HybridAdam(actor.parameters(), lr=1e-3)
    actor, optimizer = strategy.prepare((actor, optimizer))
    seqs = torch.randint(0, 32000, (4, 32), generator=torch.Generator().manual_seed(0)).cuda()
    losses = []
    for _ in range(3):
        loss = -actor(seqs, 8, torch.ones_like(seqs)).mean()
        strategy.backward(loss, actor, optimizer)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    trained = weights(strategy, actor)
    strategy.save_model(actor, out + ".model.pt", only_rank0=True)
    torch.manual_seed(1)
    other = strategy.prepare(GPTActor(config=config).to(torch.cuda.current_device()))
    before_load = weights(strategy, other)
    strategy.load_model(other, out + ".model.pt")
    loaded = weights(strategy, other)
    refused = {{
        "generate": refusal(lambda: actor.generate(seqs[:, :8], max_length=12, pad_token_id=0, eos_token_id=1)),
        "save_pretrained": refusal(lambda: strategy.save_pretrained(actor, out + ".hf")),
    }}
    strategy.backward(-actor(seqs, 8, torch.ones_like(seqs)).mean(), actor, optimizer)
    refused["second backward"] = refusal(
        lambda: strategy.backward(-actor(seqs, 8, torch.ones_like(seqs)).mean(), actor, optimizer))
    torch.save({{"numel": numel, "releases": releases_parameters(strategy.backends[0].model), "losses": losses,
                "initial": initial, "trained": trained, "before_load": before_load, "loaded": loaded,
                "refused": refused}}, out)
""")

_BACKEND = textwrap.dedent(f"""
    import sys, torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from coati_relay.training.booster_backend import TrainingBackend
    from coati_relay.training.distributed import init_process_group
    from coati_relay.training.gemini_guards import releases_parameters
    rank, world, port, out = sys.argv[1:]
    init_process_group(int(rank), int(world), "127.0.0.1", int(port), timeout_s=300)
    config = {CONFIG}
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    initial = {{k: v.detach().clone() for k, v in model.state_dict().items()}}
    backend = TrainingBackend(model, lr=1e-3, plugin="gemini", name="policy")  # check_finite: every step
    ids = torch.randint(0, 32000, (4, 32), generator=torch.Generator().manual_seed(0)).to(backend.device)
    losses = []
    for _ in range(3):
        loss = backend.model(input_ids=ids, labels=ids).loss
        backend.backward(loss)
        backend.step()
        backend.zero_grad()
        losses.append(float(loss.detach()))
    trained = backend.state_dict_for_inference()
    backend.save(out + ".ckpt")
    torch.manual_seed(1)
    other = TrainingBackend(GPT2LMHeadModel(config), lr=1e-3, plugin="gemini", name="resumed")
    before_load = other.state_dict_for_inference()
    other.load(out + ".ckpt")  # strict, as a resume is
    resumed = other.state_dict_for_inference()
    backend.backward(backend.model(input_ids=ids, labels=ids).loss)
    try:
        backend.backward(backend.model(input_ids=ids, labels=ids).loss)
        refused = None
    except Exception as exc:  # any error, named: the test expects GradientAccumulationError
        refused = f"{{type(exc).__name__}}: {{exc}}"
    torch.save({{"releases": releases_parameters(backend.model), "losses": losses, "initial": initial,
                "trained": trained, "before_load": before_load, "resumed": resumed, "refused": refused}}, out)
""")


def _moved(before, after) -> float:
    keys = [k for k in before if k in after and before[k].is_floating_point()]
    assert keys, f"no common weight names: {sorted(before)[:3]} vs {sorted(after)[:3]}"
    return sum(not torch.equal(before[k].to(after[k].dtype), after[k]) for k in keys) / len(keys)


def _close(a, b) -> bool:
    """Equal value for value (a tolerance of 1e-3 would pass a checkpoint one small step stale)."""
    return all(torch.equal(a[k].to(b[k].dtype), b[k]) for k in a)


def _check_trained(got) -> None:
    assert got["releases"], "the model is under Gemini's keep-gathered size: this test checks nothing"
    assert all(torch.isfinite(torch.tensor(got["losses"]))), got["losses"]
    assert not non_finite(got["trained"]), non_finite(got["trained"])
    assert _moved(got["initial"], got["trained"]) > 0.5, f"the steps did not move the weights: {got['losses']}"


def test_a_legacy_gemini_strategy_trains_round_trips_and_refuses_reads_above_the_chunk_threshold(tmp_path):
    (tmp_path / "rank.py").write_text(_LEGACY)
    out = tmp_path / "rank0.pt"
    kwargs = {"placement_policy": "cuda", "initial_scale": 2 ** 5}
    run_ranks(tmp_path / "rank.py", 1, [str(free_port()), "GeminiStrategy", json.dumps(kwargs), str(out)])
    got = torch.load(out, weights_only=False)
    assert got["numel"] >= 40e6, got["numel"]
    _check_trained(got)
    assert set(got["loaded"]) == set(got["trained"]) and "lm_head.weight" in got["trained"]
    assert not _close(got["before_load"], got["trained"]), "the second actor started from the trained weights"
    assert _close(got["loaded"], got["trained"]), "load_model did not restore what save_model wrote"
    refused = got["refused"]
    assert (refused["generate"] or "").startswith("RuntimeError: generate on the actor is refused"), refused
    assert "stage-3 does not support save_pretrained" in (refused["save_pretrained"] or ""), refused
    assert (refused["second backward"] or "").startswith("GradientAccumulationError"), refused


def test_training_backend_checks_each_gemini_step_and_resumes_above_the_chunk_threshold(tmp_path):
    (tmp_path / "rank.py").write_text(_BACKEND)
    out = tmp_path / "rank0.pt"
    run_ranks(tmp_path / "rank.py", 1, [str(free_port()), str(out)])
    got = torch.load(out, weights_only=False)
    _check_trained(got)
    assert not _close(got["before_load"], got["trained"])
    assert _close(got["resumed"], got["trained"]), "the resumed backend does not hold the saved weights"
    assert (got["refused"] or "").startswith("GradientAccumulationError: a second backward of the policy"), \
        got["refused"]
