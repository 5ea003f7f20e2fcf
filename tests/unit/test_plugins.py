"""The plugin table and its up-front validation (pure: no colossalai, except the signature check)."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import warnings

import pytest

from coati_relay.training import plugins
from coati_relay.training.plugins import PLUGIN_OPTIONS, PLUGINS, resolve_plugin


@pytest.fixture(autouse=True)
def fresh_warning_state(monkeypatch):
    monkeypatch.setattr(plugins, "_FALLBACK_WARNED", set())


def test_table_names():
    assert set(PLUGINS) == {"ddp", "zero2", "gemini", "hybrid"}
    assert [n for n, e in PLUGINS.items() if e.needs_cuda] == ["zero2", "gemini"]


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown plugin 'zero3'.*'ddp'.*'gemini'.*'hybrid'.*'zero2'"):
        resolve_plugin("zero3", cuda_available=False)


@pytest.mark.parametrize("name", ["zero2", "gemini"])
def test_cuda_only_plugin_on_cpu_names_what_works(name):
    with pytest.raises(ValueError, match=rf"{name}.*needs CUDA.*'ddp'.*'hybrid' with tp_size=1"):
        resolve_plugin(name, cuda_available=False)


def test_cpu_fallback_warns_once_and_uses_ddp():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = resolve_plugin("zero2", {"stage": 2}, allow_cpu_fallback=True, cuda_available=False)
        second = resolve_plugin("zero2", None, allow_cpu_fallback=True, cuda_available=False)
    assert first == second == ("ddp", {})
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "'zero2' needs CUDA" in messages[0] and "'ddp'" in messages[0] and "['stage']" in messages[0]


def test_cuda_plugins_resolve_with_defaults_on_cuda_hosts():
    assert resolve_plugin("zero2", cuda_available=True) == ("zero2", {"stage": 2, "precision": "bf16"})
    name, options = resolve_plugin("hybrid", {"precision": "bf16", "zero_stage": 1}, cuda_available=True)
    assert name == "hybrid" and options == {"tp_size": 1, "pp_size": 1, "zero_stage": 1, "precision": "bf16"}


@pytest.mark.parametrize("cuda", [True, False])
@pytest.mark.parametrize("name, options, why", [
    ("hybrid", {"pp_size": 2, "microbatch_size": 1}, "pipeline schedule"),
    ("hybrid", {"tp_size": 2, "zero_stage": 1, "precision": "bf16"}, "same rollouts on every rank"),
    ("hybrid", {"sp_size": 2}, "whole sequences"),
    ("hybrid", {"enable_sequence_parallelism": True}, "whole sequences"),
    ("hybrid", {"ep_size": 2}, "MoE plugin"),
    ("gemini", {"tp_size": 2}, "same rollouts on every rank"),
])
def test_model_parallelism_is_refused_on_every_host(name, options, why, cuda):
    """The consumer's plain forward on rollouts of each rank's own cannot run tp/pp/sp/ep; the error says why and
    what to use instead."""
    with pytest.raises(ValueError, match="not implemented by the engine") as err:
        resolve_plugin(name, options, cuda_available=cuda)
    assert why in str(err.value) and "num_consumer_procs" in str(err.value) and "zero_stage" in str(err.value)


def test_hybrid_defaults_work_on_cpu():
    assert resolve_plugin("hybrid", cuda_available=False) == (
        "hybrid", {"tp_size": 1, "pp_size": 1, "zero_stage": 0, "precision": "fp32"})
    assert resolve_plugin("ddp", {"bucket_cap_mb": 5}, cuda_available=False) == ("ddp", {"bucket_cap_mb": 5})


@pytest.mark.parametrize("name, options, match", [
    ("ddp", {"stage": 2}, r"no options \['stage'\]"),
    ("hybrid", {"tp_size": 2}, r"tp_size=2 is not implemented"),
    ("hybrid", {"pp_size": 2}, r"pp_size=2 is not implemented"),
    ("hybrid", {"zero_stage": 1, "precision": "bf16"}, r"without CUDA"),
    ("hybrid", {"zero_stage": 2}, r"zero_stage > 0 needs precision"),
    ("hybrid", {"tp_size": 0}, r"tp_size must be a positive int"),
    ("hybrid", {"precision": "fp8"}, r"precision must be one of"),
    ("ddp", {"fp8_communication": True}, r"fp8_communication needs CUDA"),
])
def test_bad_options_on_cpu(name, options, match):
    with pytest.raises(ValueError, match=match):
        resolve_plugin(name, options, cuda_available=False)


def test_bad_options_on_cuda():
    with pytest.raises(ValueError, match="stage must be 1 or 2"):
        resolve_plugin("zero2", {"stage": 3}, cuda_available=True)
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_plugin("gemini", {"precision": "fp32"}, cuda_available=True)
    with pytest.raises(TypeError, match="must be a dict"):
        resolve_plugin("ddp", ["stage"], cuda_available=True)


def test_import_does_not_load_colossalai():
    code = ("import sys, coati_relay.training.plugins as p; p.resolve_plugin('hybrid'); "
            "assert 'colossalai' not in sys.modules, 'colossalai imported'")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)


@pytest.mark.slow
def test_option_names_match_colossalai_signatures():
    from colossalai.booster import plugin as cp

    classes = {"ddp": cp.TorchDDPPlugin, "zero2": cp.LowLevelZeroPlugin, "gemini": cp.GeminiPlugin,
               "hybrid": cp.HybridParallelPlugin}
    for name, cls in classes.items():
        accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
        assert PLUGIN_OPTIONS[name] == accepted, name
        assert PLUGINS[name].factory.__name__ == cls.__name__


def test_gemini_accumulates_when_a_step_has_several_micro_batches():
    from coati_relay.training.plugins import with_accumulation

    options = {"precision": "bf16"}
    assert with_accumulation("gemini", options, 2) == {"precision": "bf16", "enable_gradient_accumulation": True}
    assert with_accumulation("gemini", options, 1) == options and options == {"precision": "bf16"}
    assert with_accumulation("zero2", {"stage": 2}, 4) == {"stage": 2}, "LowLevelZero accumulates as it is"
    with pytest.raises(ValueError, match="enable_gradient_accumulation=False with 3 micro-batches"):
        with_accumulation("gemini", {"enable_gradient_accumulation": False}, 3)


@pytest.mark.parametrize("name, options, cuda, kind", [
    ("zero2", {"stage": 2, "precision": "bf16"}, True, "fused_adamw"),   # no build at start-up
    ("ddp", {}, True, "fused_adamw"),
    ("hybrid", {"zero_stage": 1, "precision": "bf16"}, True, "fused_adamw"),
    ("zero2", {"stage": 2, "cpu_offload": True}, True, "hybrid_adam"),   # the optimizer steps on the CPU
    ("hybrid", {"zero_stage": 2, "cpu_offload": True}, True, "hybrid_adam"),
    ("gemini", {"precision": "bf16"}, True, "hybrid_adam"),              # Gemini takes ColossalAI's Adam only
    ("zero2", {"stage": 2}, False, "fused_adamw"),                     # torch's fused kernel on the CPU too
    ("ddp", {}, False, "fused_adamw"),
])
def test_the_optimizer_is_fused_adamw_unless_the_plugin_needs_hybrid_adam_on_cuda(name, options, cuda, kind):
    from coati_relay.training.plugins import optimizer_kind

    assert optimizer_kind(name, options, cuda) == kind


def test_the_kernel_build_refuses_a_host_without_cuda(monkeypatch, caplog):
    import torch

    from coati_relay.training import kernels

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        kernels.build_hybrid_adam_kernels()
    with caplog.at_level("ERROR", logger=kernels.__name__):
        assert kernels.main() == 1
    assert "were not built" in caplog.text


def test_the_kernel_build_loads_every_kernel_hybrid_adam_loads(monkeypatch):
    """On a CUDA host, the kernels module loads (building where needed) every kernel that constructing HybridAdam
    loads: with one of them missing, the first run JIT-builds it (cpu_adam_x86: 31 s). The loaders are replaced by
    a recorder, so the CPU shows which kernels each side asks for."""
    import types

    import torch

    pytest.importorskip("colossalai")
    from colossalai.kernel.kernel_loader import KernelLoader
    from colossalai.nn.optimizer import hybrid_adam

    from coati_relay.training import kernels

    loaded = []
    fake_op = types.SimpleNamespace(CPUAdamOptimizer=lambda *args: object(), multi_tensor_adam=object())

    def record(self, ext_name=None):
        loaded.append(type(self).__name__)
        return fake_op

    monkeypatch.setattr(KernelLoader, "load", record)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hybrid_adam, "get_current_device", lambda: torch.device("cpu"))
    hybrid_adam.HybridAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    by_hybrid_adam, loaded[:] = list(loaded), []
    assert set(by_hybrid_adam) == {"CPUAdamLoader", "FusedOptimizerLoader"}, by_hybrid_adam
    built = kernels.build_hybrid_adam_kernels()
    assert sorted(loaded) == sorted(by_hybrid_adam), f"built {loaded}, HybridAdam loads {by_hybrid_adam}"
    assert sorted(built) == sorted(by_hybrid_adam)
    assert kernels.hybrid_adam_loaders(cuda=True) == by_hybrid_adam
