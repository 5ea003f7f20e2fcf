"""Builds, once at set-up, the CUDA kernel that ColossalAI's ``HybridAdam`` otherwise compiles on its first use.

In a fresh environment that first use took about 60 s (four Ray workers at once: over 150 s). The build lands in
ColossalAI's kernel cache (``~/.cache/colossalai/torch_extensions``), which every later process of the same user and
installation loads in a fraction of a second. `make setup-gpu` runs ``python -m coati_relay.training.kernels``; an
offline GPU host runs it after installing its bundle. Only runs that use ``HybridAdam`` need it (Gemini, CPU
offload: `plugins.optimizer_kind`); the others step torch's fused AdamW, which needs no build.
"""
from __future__ import annotations

import logging
import sys
import time

logger = logging.getLogger(__name__)


def build_hybrid_adam_kernel() -> float:
    """Builds (or loads, when already built) ``HybridAdam``'s fused CUDA kernel; returns the seconds it took.

    Raises RuntimeError on a host without CUDA, where there is nothing to build."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("build_hybrid_adam_kernel: this host has no CUDA device; HybridAdam's kernel is built "
                           "on the GPU host (make setup-gpu)")
    from colossalai.kernel.kernel_loader import FusedOptimizerLoader

    start = time.perf_counter()
    FusedOptimizerLoader().load()
    return time.perf_counter() - start


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        seconds = build_hybrid_adam_kernel()
    except (RuntimeError, ImportError, OSError) as exc:
        logger.error("HybridAdam's CUDA kernel was not built: %s", exc)
        return 1
    logger.info("HybridAdam's CUDA kernel is ready (%.1f s)", seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
