"""Shared set-up of the old-vs-new benchmarks: offline environment, one Ray session, the tiny models, the vLLM
engine of a module, and the work counters every benchmark records next to its timings.

Each benchmark file holds one pair: the legacy side (``coati_compat.reference`` and ``coati_compat.legacy``) and the
engine side (``coati_relay``) on the same inputs, timed in one pytest-benchmark group so that they print side by side.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

# (group, name, extra_info) of every benchmark of the session, printed at the end.
_WORK: List[Tuple[str, str, Dict[str, Any]]] = []


def pytest_configure(config):
    # The legacy side calls deprecated names on purpose; colossalai and torch.jit notices are not about this code.
    for line in ("ignore::FutureWarning", r"ignore:.*torch\.jit:DeprecationWarning",
                 "ignore:.*(apex|tensornvme):UserWarning"):
        config.addinivalue_line("filterwarnings", line)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster for the whole benchmark session (starting one costs about 4.5 s)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """The random tiny Qwen2 (hidden 128, 2 layers, vocab 320) and its tokenizer."""
    from coati_relay.toy import build_tiny_model

    return str(build_tiny_model())


@pytest.fixture(scope="session")
def small_model_path() -> str:
    """A slightly bigger random Qwen2 (hidden 256, 4 layers, about 2.4M parameters)."""
    from coati_relay.toy import build_tiny_model

    return str(build_tiny_model(hidden_size=256, num_layers=4))


@pytest.fixture(scope="session")
def medium_model_path() -> str:
    """A random Qwen2 of hidden 512 and 8 layers (about 18M parameters), the size from which vLLM pays off on CPU:
    per-call overheads weigh less there, so the differences between the engines show better."""
    from coati_relay.toy import build_tiny_model

    return str(build_tiny_model(hidden_size=512, num_layers=8))


@pytest.fixture(scope="module")
def vllm_backend(request, vllm_model_path):
    """A real vLLM engine on the module's ``vllm_model_path`` fixture, started once per module that uses it (float32,
    the faster dtype on CPU). A module may set ``VLLM_KWARGS`` (keywords for ``vllm.LLM``, e.g. ``enforce_eager``),
    and its benchmarks may change the engine's sampling config and weights."""
    from coati_relay.config.schema import SamplingConfig
    from coati_relay.inference import VLLMBackend

    backend = VLLMBackend(vllm_model_path, SamplingConfig(), seed=0, **getattr(request.module, "VLLM_KWARGS", {}))
    yield backend
    backend.close()


@pytest.fixture
def work(benchmark):
    """A dict the test fills with the work one round does (``tokens``, ``items``, ``bytes``, ...).

    The counts go to ``benchmark.extra_info`` (saved with ``--benchmark-save``/``--benchmark-json``) with their
    rates per second of the mean round (``tokens_per_s``...) and torch's intra-op thread count; everything in
    ``extra_info`` is printed at the end of the session.
    """
    import torch

    counts: Dict[str, float] = {}
    yield counts
    benchmark.extra_info.update(counts)
    stats = getattr(benchmark, "stats", None)
    if stats is not None and stats.stats.mean > 0:
        benchmark.extra_info.update({f"{key}_per_s": value / stats.stats.mean for key, value in counts.items()})
    benchmark.extra_info["torch_threads"] = torch.get_num_threads()
    _WORK.append((benchmark.group or "", benchmark.name, dict(benchmark.extra_info)))


@pytest.fixture
def figures(benchmark):
    """A dict the test fills with figures of its own (medians over rounds, memory, curves): saved in
    ``benchmark.extra_info`` and printed at the end of the session like `work`'s counts, without rates."""
    values: Dict[str, Any] = {}
    yield values
    if not values:  # skipped, or failed before its figures
        return
    benchmark.extra_info.update(values)
    _WORK.append((benchmark.group or "", benchmark.name, dict(benchmark.extra_info)))


def pytest_terminal_summary(terminalreporter):
    if not _WORK:
        return
    terminalreporter.section("work per round and rates (per second of the mean round)")
    for group, name, info in sorted(_WORK, key=lambda r: r[0]):
        terminalreporter.write_line(f"{group} | {name} | " + ", ".join(f"{k} {_number(v)}" for k, v in info.items()))


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)
