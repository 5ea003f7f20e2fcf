"""Checkpoint writes survive a kill: a process killed while it writes a legacy ``save_model`` under a booster (a file,
or the booster's sharded directory) leaves the previous checkpoint whole; plain files are fsynced before their
rename."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from coati_relay.training import checkpoint_files

# Saves a checkpoint from a DDP strategy (a booster), changes the weights, then saves again with a torch.save that
# writes half of its bytes and kills the process (SIGKILL), as a kill mid-write would.
SCRIPT = textwrap.dedent("""
    import io, os, signal, sys, warnings
    import torch
    from coati_compat.legacy.strategies import DDPStrategy
    warnings.simplefilter("ignore")
    path, shard = sys.argv[1], sys.argv[2] == "shard"
    strategy = DDPStrategy()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    model, _ = strategy.prepare((model, torch.optim.Adam(model.parameters())))
    strategy.save_model(model, path, shard=shard)
    torch.save({k: v.clone() for k, v in strategy.unwrap_model(model).state_dict().items()}, path + ".expected")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    real_save = torch.save

    def save_then_die(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        with open(f, "wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
            os.fsync(out.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save_then_die
    strategy.save_model(model, path, shard=shard)
    print("the second save returned")
""")


def _saved_state(path: str) -> dict:
    if os.path.isfile(path):
        return torch.load(path, map_location="cpu", weights_only=True)
    [index] = [f for f in os.listdir(path) if f.endswith(".index.json")]
    with open(os.path.join(path, index)) as f:
        files = set(json.load(f)["weight_map"].values())
    state = {}
    for name in files:
        state.update(torch.load(os.path.join(path, name), map_location="cpu", weights_only=True))
    return state


@pytest.mark.slow
@pytest.mark.parametrize("form", ["file", "shard"])
def test_a_kill_mid_save_leaves_the_previous_checkpoint_whole(tmp_path, form):
    path = str(tmp_path / ("actor.pt" if form == "file" else "actor"))
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29500 + os.getpid() % 1000))
    out = subprocess.run([sys.executable, "-c", SCRIPT, path, form], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr[-3000:]
    expected = torch.load(path + ".expected", weights_only=True)
    saved = _saved_state(path)
    assert saved.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(saved[key], value), key


def test_save_file_fsyncs_the_file_before_its_rename(tmp_path, monkeypatch):
    """The order of the system calls (each still made): fsync of the written file, the rename, fsync of the
    directory."""
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append("replace") or real_replace(a, b))
    checkpoint_files.save_file({"w": torch.ones(3)}, str(tmp_path / "w.pt"))
    assert calls == ["fsync", "replace", "fsync"]
    assert torch.equal(torch.load(tmp_path / "w.pt", weights_only=True)["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["w.pt"]
