"""CPU mode (`coati_compat.cpu_mode`): the translations one by one, and the start-up hook in fresh interpreters.
The Ray side, in every worker of a real local cluster, is in tests/e2e/test_cpu_mode_scripts.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coati_compat.cpu_mode import patches as cpu_mode


def run_python(code: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (cpu_mode.ENV, cpu_mode.GPUS_ENV)}
    env.update(env_vars)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)


def test_local_start_declares_logical_gpus_and_cpus(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv(cpu_mode.GPUS_ENV, "6")
    out = cpu_mode.init_kwargs(None, {"include_dashboard": False})
    assert out["num_gpus"] == 6 and out["num_cpus"] == max(os.cpu_count(), 6) and not out["include_dashboard"]
    assert cpu_mode.init_kwargs("local", {"num_gpus": 2, "num_cpus": 1}) == {"num_gpus": 2, "num_cpus": 1}
    assert cpu_mode.init_kwargs("ray://head:10001", {}) == {}, "a joined cluster keeps its resources"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cpu_mode.init_kwargs(None, {}) == {}


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_bad_gpu_count_is_named(monkeypatch, value):
    monkeypatch.setenv(cpu_mode.GPUS_ENV, value)
    with pytest.raises(ValueError, match=r"\$COATI_RELAY_CPU_MODE_GPUS must be a whole number >= 1"):
        cpu_mode.logical_gpus()


def test_joined_cluster_without_gpus_is_refused_with_the_fix():
    cpu_mode.check_cluster_gpus({"CPU": 4.0, "GPU": 2.0})
    with pytest.raises(RuntimeError, match=r"no GPU resources.*ray start --head --num-gpus=8"):
        cpu_mode.check_cluster_gpus({"CPU": 4.0})


def test_strict_spread_and_shortfall():
    assert cpu_mode.spread_strategy("STRICT_SPREAD", 2, 1) == "SPREAD"
    assert cpu_mode.spread_strategy("STRICT_SPREAD", 2, 2) == "STRICT_SPREAD"
    assert cpu_mode.spread_strategy("PACK", 4, 1) == "PACK"
    bundles = [{"GPU": 2, "CPU": 2}] * 2
    assert cpu_mode.shortfall(bundles, {"GPU": 4.0, "CPU": 8.0}) == {}
    assert cpu_mode.shortfall(bundles, {"GPU": 1.0, "CPU": 3.0}) == {"GPU": 3.0, "CPU": 1.0}


@pytest.mark.parametrize("adamw_mode,weight_decay", [(True, 0.0), (True, 0.1), (False, 0.1)])
def test_hybrid_adam_stand_in_steps_as_torch_adam(adamw_mode, weight_decay):
    stand_in = cpu_mode._cpu_hybrid_adam_class()
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    ours = stand_in(a.parameters(), lr=1e-2, weight_decay=weight_decay, adamw_mode=adamw_mode,
                    nvme_offload_fraction=0.0)
    ref_cls = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    ref = ref_cls(b.parameters(), lr=1e-2, weight_decay=weight_decay)
    x = torch.randn(8, 4)
    for _ in range(3):
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    assert all(torch.allclose(p, q, atol=1e-7) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="bias_correction=False"):
        stand_in(a.parameters(), bias_correction=False)


def test_mode_off_changes_nothing():
    out = run_python("import torch, ray, torch.distributed as dist\n"
                     "print(ray.init.__module__, torch.cuda.current_device.__module__,"
                     " dist.init_process_group.__module__)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ray._private.worker", "torch.cuda", "torch.distributed.distributed_c10d"]


def test_installing_the_finder_leaves_cpu_mode_to_the_start_up():
    """``finder.install()`` serves the legacy paths only; the ``.pth`` start-up (`startup.run`) also turns CPU mode on
    when ``$COATI_RELAY_CPU_MODE`` is set. ``-S``: no ``.pth`` of the environment runs before the code."""
    code = ("import sys\n"
            "from coati_compat.imports import finder, startup\n"
            "def mode(): return ('coati_compat.cpu_mode.patches' in sys.modules,"
            " any(type(f).__name__ == 'AfterImport' for f in sys.meta_path))\n"
            "finder.install(); print(*mode())\n"
            "startup.run(); print(*mode(), 'torch' in sys.modules)\n")
    roots = [str(Path(__file__).resolve().parents[3] / d) for d in ("backend", "compat")]
    env = {**os.environ, cpu_mode.ENV: "1", "PYTHONPATH": os.pathsep.join(roots)}
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "True", "True", "False"], out.stdout


def test_mode_on_patches_at_first_import_and_warns_once():
    code = ("import warnings\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import os, torch, torch.distributed as dist, ray\n"
            "    from colossalai.nn.optimizer import HybridAdam\n"
            "    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='29561', RANK='0', WORLD_SIZE='1')\n"
            "    dist.init_process_group('nccl')\n"
            "    x = torch.ones(2).cuda().to(torch.cuda.current_device())\n"
            "    opt = HybridAdam(torch.nn.Linear(2, 2).parameters(), lr=0.1)\n"
            "    print(dist.get_backend(), x.device.type, type(opt).__mro__[1].__name__,"
            " ray.init.__module__)\n"
            "print(sum('COATI_RELAY_CPU_MODE=1' in str(w.message) for w in caught))\n")
    out = run_python(code, COATI_RELAY_CPU_MODE="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["gloo", "cpu", "Adam", "coati_compat.cpu_mode.patches", "1"], out.stdout
    assert "CPU mode: an NCCL process group uses gloo" in out.stderr
    assert "CPU mode: HybridAdam is torch.optim.Adam" in out.stderr


@pytest.mark.parametrize("script,gpus,expected", [
    ("missing.py", "8", "legacy-run: missing.py is not a file"),
    (__file__, "zero", "COATI_RELAY_CPU_MODE_GPUS must be a whole number >= 1"),
])
def test_legacy_run_refuses_bad_input_before_running(script, gpus, expected):
    out = run_python(f"import sys; from coati_relay.cli import main; sys.exit(main(['legacy-run', {script!r}]))",
                     **{cpu_mode.GPUS_ENV: gpus})
    assert out.returncode == 2 and expected in out.stderr, out.stderr
