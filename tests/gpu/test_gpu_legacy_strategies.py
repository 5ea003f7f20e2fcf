"""The legacy strategies on CUDA, fronts over the engine's `TrainingBackend` (one runtime for legacy and engine):
naive, ddp, LowLevelZero stage 1 and 2, Gemini with the legacy placements "cuda", "cpu" and "auto", and
``ColossalAIStrategy`` stage 2 and 3 each prepare a tiny GPT-2 actor with its optimizer on the GPU, train it through
``strategy.backward`` / ``optimizer_step``, and round-trip its weights through ``save_model`` / ``load_model``. And
the four-role legacy script (``examples/legacy/four_role_ppo.py``), unchanged, with each of its three strategies:
the actor it saves is finite and moved."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from gpu_lane import MARKS, non_finite, run_ranks

from coati_relay.training.distributed import free_port

pytestmark = MARKS

FOUR_ROLE = Path(__file__).resolve().parents[2] / "examples" / "legacy" / "four_role_ppo.py"
SCALE = {"initial_scale": 2 ** 5}  # the fp16 strategies: no step lost to an overflowing first loss scale

# One rank of a legacy script: a strategy, a GPT-2 actor and its optimizer prepared on the GPU, six steps, then the
# trained weights, a saved file and a second actor (another initialisation) that loads it.
_RANK = textwrap.dedent("""
    import json, os, sys, torch
    rank, world, port, cls, kwargs, optim, out = sys.argv[1:]
    os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    from coati.models.gpt import GPTActor
    from coati.trainer import strategies
    from transformers import GPT2Config

    def weights(strategy, actor):
        return {k: v.detach().cpu().clone() for k, v in next(strategy.get_model_state_dict_shard(actor)).items()}

    strategy = getattr(strategies, cls)(**json.loads(kwargs))
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64)
    torch.manual_seed(0)
    actor = GPTActor(config=config).to(torch.cuda.current_device())
    initial = {k: v.detach().cpu().clone() for k, v in actor.model.state_dict().items()}
    if optim == "hybrid_adam":
        from colossalai.nn.optimizer import HybridAdam
        optimizer = HybridAdam(actor.parameters(), lr=1e-2)
    else:
        optimizer = torch.optim.Adam(actor.parameters(), lr=1e-2)
    actor, optimizer = strategy.prepare((actor, optimizer))
    seqs = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0)).cuda()
    losses = []
    for _ in range(6):
        loss = -actor(seqs, 8, torch.ones_like(seqs)).mean()  # log-probs [4, 8] of the last 8 tokens
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
    torch.save({"plugin": strategy.plugin_name, "device": str(strategy.backends[0].device), "losses": losses,
                "initial": initial, "trained": trained, "before_load": before_load,
                "loaded": weights(strategy, other)}, out)
""")

STRATEGIES = [
    ("NaiveStrategy", {}, "adam", None),
    ("DDPStrategy", {}, "adam", "ddp"),
    ("LowLevelZeroStrategy", {"stage": 1, **SCALE}, "hybrid_adam", "zero2"),
    ("LowLevelZeroStrategy", {"stage": 2, **SCALE}, "hybrid_adam", "zero2"),
    ("GeminiStrategy", {"placement_policy": "cuda", **SCALE}, "hybrid_adam", "gemini"),
    ("GeminiStrategy", {"placement_policy": "cpu", **SCALE}, "hybrid_adam", "gemini"),
    ("GeminiStrategy", {"placement_policy": "auto", **SCALE}, "hybrid_adam", "gemini"),
    ("ColossalAIStrategy", {"stage": 2, **SCALE}, "hybrid_adam", "zero2"),
    ("ColossalAIStrategy", {"stage": 3, **SCALE}, "hybrid_adam", "gemini"),
]


def _moved(before, after) -> float:
    """The fraction of ``before``'s tensors that differ in ``after``, compared in ``after``'s dtype (an fp16 copy
    of untouched weights is not a move)."""
    keys = [k for k in before if k in after and before[k].is_floating_point()]
    assert keys, f"no common weight names: {sorted(before)[:3]} vs {sorted(after)[:3]}"
    return sum(not torch.equal(before[k].to(after[k].dtype), after[k]) for k in keys) / len(keys)


def _close(a, b) -> bool:
    return all(torch.allclose(a[k].float(), b[k].float(), rtol=1e-3, atol=1e-3) for k in a)


@pytest.mark.parametrize("cls,kwargs,optim,plugin", STRATEGIES,
                         ids=[c + "".join(f"-{kw[k]}" for k in ("stage", "placement_policy") if k in kw)
                              for c, kw, _, _ in STRATEGIES])
def test_legacy_strategy_trains_and_round_trips_on_cuda(tmp_path, cls, kwargs, optim, plugin):
    (tmp_path / "rank.py").write_text(_RANK)
    out = tmp_path / "rank0.pt"
    run_ranks(tmp_path / "rank.py", 1, [str(free_port()), cls, json.dumps(kwargs), optim, str(out)])
    got = torch.load(out, weights_only=False)
    assert got["plugin"] == plugin and got["device"].startswith("cuda"), (got["plugin"], got["device"])
    assert not non_finite(got["trained"]), non_finite(got["trained"])
    assert all(torch.isfinite(torch.tensor(got["losses"]))), got["losses"]
    assert _moved(got["initial"], got["trained"]) > 0.5, f"the steps did not move the weights: {got['losses']}"
    assert set(got["loaded"]) == set(got["trained"])
    assert not _close(got["before_load"], got["trained"]), "the second actor started from the trained weights"
    assert _close(got["loaded"], got["trained"]), "load_model did not restore what save_model wrote"


# Runs the legacy script unchanged on a Ray cluster whose one GPU counts as four (a bundle per role; every worker
# sees the device): the script's own ray.init() joins the cluster started here.
_DRIVER = textwrap.dedent("""
    import runpy, sys, ray
    script, *args = sys.argv[1:]
    ray.init(address="local", num_cpus=8, num_gpus=4, include_dashboard=False)
    ray.init = lambda *a, **k: None
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        ray.shutdown()
""")


@pytest.mark.parametrize("strategy", ["ddp", "colossalai_zero2", "colossalai_gemini"])
def test_four_role_script_trains_on_cuda(tmp_path, strategy):
    """Four groups of one GPU worker each; the actor it saves is finite and moved from the checkpoint."""
    pytest.importorskip("pandas", reason="the four-role script reads its prompts with pandas")
    pytest.importorskip("ray", reason="the four-role script needs Ray")
    from safetensors.torch import load_file

    from coati_relay.toy import build_tiny_model, write_toy_dataset

    model = build_tiny_model(tmp_path / "gpt2", arch="gpt2", hidden_size=64)
    prompts = write_toy_dataset(tmp_path / "prompts.csv", num_prompts=16, fmt="csv")
    (tmp_path / "driver.py").write_text(_DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "HF_HUB_OFFLINE": "1",
           "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("RAY_ADDRESS", None)
    args = ["--pretrain", model, "--prompt_csv", prompts, "--strategy", strategy, "--workers_per_role", 1,
            "--steps", 6, "--batch_size", 2, "--new_tokens", 8, "--lr", 1e-3, "--save_dir", tmp_path / "ckpt",
            "--timeout_s", 600]
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(FOUR_ROLE), *map(str, args)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert (tmp_path / "ckpt" / "actor.pt").is_file(), f"no actor saved (exit {proc.returncode}):\n{output[-6000:]}"
    start = load_file(str(model / "model.safetensors"))
    end = torch.load(tmp_path / "ckpt" / "actor.pt", map_location="cpu")
    end = {k[len("model."):]: v for k, v in end.items() if k.startswith("model.")}
    assert set(start) <= set(end), sorted(set(start) - set(end))[:3]
    assert not non_finite(end), non_finite(end)
    assert _moved(start, end) > 0.5, f"the trained actor did not move:\n{output[-3000:]}"
