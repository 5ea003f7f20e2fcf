"""Shared fixtures: one Ray cluster per test session, tiny local models, offline Hugging Face."""
from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

# The soak harness the soak tests drive lives with the benchmarks (benchmarks/memory_soak.py): a tool, not the engine.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
# A suite started in the background by a non-interactive shell inherits SIGINT ignored, and so would every process it
# starts (the Ctrl-C test's driver, the Ray nodes a test removes): Python's own handler makes them interruptible again.
signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models on 2 shared cores: one thread each is fastest


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models on a shared two-core host: one intra-op thread is faster and steadier than two (also when
    OMP_NUM_THREADS was set to something else before the run)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


PROCESS_GROUP_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def process_group_env_restored():
    """The legacy `set_dist_env` sets RANK, WORLD_SIZE, ... in the calling process, as it did upstream: a test that
    calls it in the test process must not leave a group behind for the next test's strategy to wait for."""
    before = {key: os.environ.get(key) for key in PROCESS_GROUP_ENV}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def dynamo_warnings():
    """The warnings torch._dynamo logs meanwhile, as messages (its loggers do not reach pytest's capture)."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler, logger = Keep(level=logging.WARNING), logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster shared by every test of the session (start ~4.5 s, shutdown ~1.3 s)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=8, include_dashboard=False, namespace="coati-relay-tests",
                 log_to_driver=False, configure_logging=False)
    yield ray
    gc.collect()  # object refs and actor handles left in reference cycles are released while the worker is alive
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """Path of a random tiny Qwen2 (hidden 128, 2 layers, vocab 320) with its tokenizer, built once."""
    from coati_relay.toy import build_tiny_model

    return str(build_tiny_model())


@pytest.fixture
def cyclic_garbage():
    """``count(fn)``: runs ``fn()`` and returns (its result, how many objects it left as cyclic garbage, which only
    the collector frees), counted with ``gc.DEBUG_SAVEALL``. The collector also finds what other threads of the
    process left meanwhile (an xdist worker's I/O thread, once 16 objects), so ``fn`` runs up to three times and the
    fewest count: garbage that ``fn`` itself makes shows in every run."""
    def once(fn):
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            result = fn()
            gc.collect()
            return result, len(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    def count(fn):
        result, fewest = once(fn)
        for _ in range(2):
            if not fewest:
                break
            result, garbage = once(fn)
            fewest = min(fewest, garbage)
        return result, fewest

    return count
