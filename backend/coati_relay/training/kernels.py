"""Builds, once at set-up, every kernel ColossalAI's ``HybridAdam`` otherwise compiles on its first use.

``HybridAdam``'s constructor loads two kernels (colossalai 0.5): ``CPUAdamLoader`` in its base class ``CPUAdam``
(``cpu_adam_x86`` on x86-64, ``cpu_adam_arm`` on ARM: the step of the parameters whose optimizer state lives on the
CPU) and, where CUDA is available, ``FusedOptimizerLoader`` (``fused_optim_cuda``: the step of those on the GPU). Each
loader imports a kernel prebuilt into the installation (``BUILD_EXT=1``) or else JIT-builds it: in a fresh
environment about 60 s for ``fused_optim_cuda`` and 31 s for ``cpu_adam_x86`` (four Ray workers at once: over 150 s).
The build lands in ColossalAI's kernel cache (``~/.cache/colossalai/torch_extensions``), which every later process of
the same user and installation loads in a fraction of a second. `make setup-gpu` runs
``python -m coati_relay.training.kernels``; an offline GPU host runs it after installing its bundle. Only runs that
use ``HybridAdam`` need it (Gemini, CPU offload: `plugins.optimizer_kind`); the others step torch's fused AdamW, which
needs no build.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Dict, List

logger = logging.getLogger(__name__)


def hybrid_adam_loaders(cuda: bool) -> List[str]:
    """The names of the ``colossalai.kernel.kernel_loader`` classes whose kernels ``HybridAdam``'s constructor loads
    on a host with (``cuda``) or without CUDA, in the order it loads them."""
    return ["CPUAdamLoader", "FusedOptimizerLoader"] if cuda else ["CPUAdamLoader"]


def build_hybrid_adam_kernels() -> Dict[str, float]:
    """Builds (or loads, when already built) every kernel of `hybrid_adam_loaders`; returns the seconds each took,
    by loader name.

    Raises RuntimeError on a host without CUDA: colossalai 0.5's CPU Adam kernel is a CUDA extension too (it links
    the CUDA runtime), so there is nothing to build there."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("build_hybrid_adam_kernels: this host has no CUDA device; HybridAdam's kernels are built "
                           "on the GPU host (make setup-gpu)")
    from colossalai.kernel import kernel_loader

    seconds: Dict[str, float] = {}
    for name in hybrid_adam_loaders(cuda=True):
        start = time.perf_counter()
        getattr(kernel_loader, name)().load()
        seconds[name] = time.perf_counter() - start
    return seconds


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        seconds = build_hybrid_adam_kernels()
    except (RuntimeError, ImportError, OSError, AssertionError) as exc:  # AssertionError: no usable kernel
        logger.error("HybridAdam's kernels were not built: %s", exc)
        return 1
    logger.info("HybridAdam's kernels are ready: %s",
                ", ".join(f"{name} {s:.1f} s" for name, s in seconds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
