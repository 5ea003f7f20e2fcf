"""CPU mode's CUDA device arguments (`coati_compat.cpu_mode.redirect`, `coati_compat.cpu_mode.thread_hooks`): each
device form under the function mode, then the whole mode in fresh interpreters: every thread, Ray's actor threads,
mode off."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from coati_compat.cpu_mode import patches as cpu_mode
from coati_compat.cpu_mode import redirect, thread_hooks

CUDA_FORMS = ["cuda", "cuda:1", torch.device("cuda"), torch.device("cuda", 1), 0, 1]
FACTORIES = {
    "zeros": lambda d: torch.zeros(2, device=d),
    "randint": lambda d: torch.randint(0, 5, (2, 3), device=d),
    "tensor": lambda d: torch.tensor([1.0, 2.0], device=d),
    "as_tensor": lambda d: torch.as_tensor([1, 2], device=d),
    "arange": lambda d: torch.arange(3, device=d),
    "full": lambda d: torch.full((2,), 7.0, device=d),
    "empty_like": lambda d: torch.empty_like(torch.ones(2), device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(2), device=d),
    "new_zeros": lambda d: torch.ones(2).new_zeros(3, device=d),
}
MOVES = {
    "Tensor.to(d)": lambda d: torch.ones(2).to(d),
    "Tensor.to(d, dtype)": lambda d: torch.ones(2).to(d, torch.float64),
    "Tensor.to(d, non_blocking)": lambda d: torch.ones(2).to(d, non_blocking=True),
    "Tensor.to(device=, dtype=)": lambda d: torch.ones(2).to(device=d, dtype=torch.float64),
    "Module.to(d)": lambda d: torch.nn.Linear(2, 2).to(d).weight,
    "Module.to(device=, dtype=)": lambda d: torch.nn.Linear(2, 2).to(device=d, dtype=torch.float64).weight,
    "Module.to(d, dtype)": lambda d: torch.nn.Linear(2, 2).to(d, torch.float64).weight,
}


def run_python(code: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (cpu_mode.ENV, cpu_mode.GPUS_ENV)}
    env.update(env_vars)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture
def mode():
    """The function mode pushed on this thread's stack; yields the names of the calls it reported first."""
    noted = []
    with redirect.CudaToCpu(noted.append):
        yield noted


@pytest.mark.parametrize("device", CUDA_FORMS, ids=repr)
@pytest.mark.parametrize("call", list(FACTORIES) + list(MOVES))
def test_cuda_device_arguments_land_on_the_cpu(mode, call, device):
    out = {**FACTORIES, **MOVES}[call](device)
    assert out.device == torch.device("cpu")
    assert len(mode) == 1, "the first redirect is reported, once"


def test_moves_keep_their_other_arguments(mode):
    t = torch.arange(4.0)
    moved = t.to("cuda", torch.float64, copy=True)
    assert moved.dtype == torch.float64 and moved.data_ptr() != t.data_ptr()
    assert t.to(torch.device("cuda", 0)) is t, "a move to where the tensor is stays a no-op"
    model = torch.nn.Linear(2, 3).to(device="cuda:1", dtype=torch.float16)
    assert model.weight.dtype == torch.float16 and model.weight.shape == (3, 2)
    assert torch.randint(3, 9, (50,), device="cuda").min() >= 3


@pytest.mark.parametrize("call", [
    lambda: torch.zeros(2, device="cpu"), lambda: torch.ones(2).to(torch.float64), lambda: torch.ones(2).to("cpu"),
    lambda: torch.ones(2).to(torch.zeros(1, dtype=torch.int64)), lambda: torch.zeros(2, device=torch.device("cpu")),
    lambda: torch.ones(2) + torch.ones(2),
], ids=["cpu-kwarg", "dtype", "cpu-positional", "like-tensor", "cpu-device", "op"])
def test_other_calls_pass_unchanged(mode, call):
    assert call().device.type == "cpu"
    assert mode == [], "nothing was redirected"


def test_meta_device_and_bad_ordinals_pass_to_torch_unchanged(mode):
    assert torch.zeros(2, device="meta").device.type == "meta"
    with pytest.raises(RuntimeError):
        torch.zeros(2, device=-1)
    assert mode == []


def test_a_device_context_above_the_mode_hands_cuda_down_to_it(mode):
    with torch.device("cuda"):
        assert torch.ones(2).device.type == "cpu"
    assert mode == ["torch.ones"]


def test_is_cuda_device():
    assert all(redirect.is_cuda_device(d) for d in CUDA_FORMS)
    for other in ("cpu", "meta", "cudax", torch.device("cpu"), -1, True, None, torch.float32):
        assert not redirect.is_cuda_device(other), other


def test_thread_scope_undoes_what_its_hooks_did(monkeypatch):
    calls = []

    def hook():
        calls.append("set")
        return lambda: calls.append("undone")

    monkeypatch.setattr(thread_hooks, "_hooks", [hook])
    assert thread_hooks._in_scope(lambda x: calls.append(x) or "result", "body") == "result"
    assert calls == ["set", "body", "undone"]
    with pytest.raises(ValueError):
        thread_hooks._in_scope(lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert calls[-1] == "undone", "undone also when the body raises"


def test_cuda_present_installs_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    depth = torch._C._len_torch_function_stack()
    assert cpu_mode.patch_torch() is False
    assert torch._C._len_torch_function_stack() == depth


def test_mode_off_installs_no_function_mode_and_cuda_still_fails():
    out = run_python("""
        import threading, torch
        def check():
            assert torch._C._len_torch_function_stack() == 0
            try:
                torch.zeros(1, device="cuda")
            except (AssertionError, RuntimeError) as e:
                print(type(e).__name__)
        check()
        t = threading.Thread(target=check); t.start(); t.join()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["AssertionError", "AssertionError"], "Torch not compiled with CUDA enabled"


def test_mode_on_covers_every_thread_and_exits_cleanly():
    """Main thread, plain threads and a thread pool; the process must also exit 0: a mode left on a finished
    thread's stack aborts the interpreter at shutdown."""
    out = run_python("""
        import threading, warnings
        from concurrent.futures import ThreadPoolExecutor
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
            def place(i):
                return (torch.randint(0, 9, (2,), device=f"cuda:{i % 2}").device.type
                        + torch.ones(1).to(torch.device("cuda", i % 2)).device.type
                        + torch.tensor([i], device=torch.cuda.current_device()).device.type)
            seen = {place(0)}
            threads = [threading.Thread(target=lambda i=i: seen.add(place(i))) for i in range(8)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            with ThreadPoolExecutor(4) as pool:
                seen.update(pool.map(place, range(8)))
        print(sorted(seen), torch.cuda.is_available(), torch.device("cuda", 1))
        print(sum("COATI_RELAY_CPU_MODE=1" in str(w.message) for w in caught))
    """, COATI_RELAY_CPU_MODE="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["['cpucpucpu'] False cuda:1", "1"], out.stdout
    assert "CPU mode: CUDA device arguments place on the CPU (first: torch.randint)" in out.stderr


@pytest.mark.slow
def test_mode_on_covers_ray_actor_threads():
    """Threaded actors and concurrency groups run methods in threads of Ray's own; async actors in an event-loop
    thread; plain actors and tasks in the worker's main thread."""
    out = run_python("""
        import threading, ray, torch
        ray.init(include_dashboard=False, log_to_driver=False)

        def place():
            kind = type(threading.current_thread()).__name__
            return kind, torch.zeros(1, device="cuda").device.type + torch.ones(1).to(0).device.type

        @ray.remote(max_concurrency=2)
        class Threaded:
            def __init__(self):
                self.at_init = place()
            def place(self):
                return [self.at_init, place()]

        @ray.remote(concurrency_groups={"io": 2})
        class Grouped:
            @ray.method(concurrency_group="io")
            def place(self):
                return [place()]

        @ray.remote
        class Async:
            async def place(self):
                return [place()]

        actors = [Threaded.remote(), Grouped.remote(), Async.remote()]
        results = ray.get([a.place.remote() for a in actors] + [ray.remote(place).remote()])
        for row in results[:3] + [[results[3]]]:
            print(" ".join(f"{kind}:{where}" for kind, where in row))
    """, COATI_RELAY_CPU_MODE="1", RAY_ADDRESS="local")
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.split("\n")[:4] == [
        "_MainThread:cpucpu _DummyThread:cpucpu", "_DummyThread:cpucpu", "Thread:cpucpu", "_MainThread:cpucpu"], \
        out.stdout
