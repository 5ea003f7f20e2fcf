"""CPU mode: GPU-era Ray scripts (``@ray.remote(num_gpus=1)``, ``{"GPU": 1, "CPU": 1}`` bundles, ``.cuda()``, NCCL)
on a host or Ray cluster without GPUs, for smoke tests in CI or on a laptop. Opt-in: ``COATI_RELAY_CPU_MODE=1`` in
the environment, or ``coati-relay legacy-run SCRIPT [ARGS...]``, which sets it and runs the script.

With the mode on, in every Python process of the environment (the ``coati_relay_legacy.pth`` line calls `install`
at start-up, through `coati_compat.imports.startup`, so Ray's worker processes are covered, user-defined actors
included):

- after ``import torch``, when CUDA is absent: ``.cuda()``, ``torch.cuda.current_device()``, ``set_device()`` stay
  on the CPU (`coati_compat.cpu_mode.redirect`); so do CUDA device arguments, ``device="cuda"``/``"cuda:N"``/
  ``torch.device("cuda", N)``/``N`` of the factories (``torch.zeros``, ``torch.randint``, ``torch.tensor``,
  ``torch.empty_like``, ...) and of ``Tensor.to``/``Module.to`` (`coati_compat.cpu_mode.redirect` too, a torch function
  mode active in every thread that runs user code, threaded Ray actors' included: `coati_compat.cpu_mode.thread_hooks`;
  it adds about 1 us to every torch call of the process);
  ``torch.distributed`` process groups asked for with the ``"nccl"`` backend use ``"gloo"``;
- after ``import ray``: ``ray.init()`` that starts a local cluster declares ``$COATI_RELAY_CPU_MODE_GPUS`` logical
  GPUs (default 32; nothing runs on them, they only let ``num_gpus`` requests and GPU bundles be placed) and as many
  logical CPUs (more where the host has more), unless the script passes ``num_gpus``/``num_cpus`` itself;
  ``ray.init`` that joins a cluster without GPU resources fails at once saying how to start one with logical GPUs; a
  ``STRICT_SPREAD`` placement group with more bundles than the cluster has nodes becomes ``SPREAD``, and one that
  asks for more than the cluster has free is named in a warning (it would wait, and a script's
  ``ray.get(pg.ready())`` with it);
- after ``import colossalai.nn.optimizer``, when CUDA is absent: ``HybridAdam`` (whose CPU kernel does not build
  here) is a ``torch.optim.Adam`` taking the same keywords and making the same update.

Each process warns once (``UserWarning``) when the mode first changes something in it, and logs the first change of
each kind. With CUDA present, or the mode off, nothing is changed.
"""
from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Any, Callable, Dict, Optional

from coati_compat.imports.after_import import patch_after_import

logger = logging.getLogger(__name__)

ENV = "COATI_RELAY_CPU_MODE"
GPUS_ENV = "COATI_RELAY_CPU_MODE_GPUS"
DEFAULT_GPUS = 32
WARNING_TEXT = (f"{ENV}=1 and no CUDA here: GPU requests are placed on logical GPUs, .cuda(), CUDA device "
                "arguments (device='cuda', .to('cuda')) and torch.cuda.current_device() stay on the CPU, NCCL process "
                "groups use gloo")

_lock = threading.Lock()
_warned: set = set()
_patched: set = set()


def enabled() -> bool:
    """True when ``$COATI_RELAY_CPU_MODE`` is set to 1/true/yes."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes")


def logical_gpus() -> int:
    """``$COATI_RELAY_CPU_MODE_GPUS`` (default 32): the logical GPUs a local cluster declares in CPU mode."""
    raw = os.environ.get(GPUS_ENV, str(DEFAULT_GPUS))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"${GPUS_ENV} must be a whole number >= 1 (the logical GPUs of a local Ray cluster in CPU "
                         f"mode), got {raw!r}")
    return value


def _warn_once(kind: str, detail: str, stacklevel: int = 3) -> None:
    """The mode's warning, once per process; a log line for the first change of each ``kind``. ``stacklevel`` as
    ``warnings.warn`` counts it from here."""
    with _lock:
        if kind in _warned:
            return
        first = not _warned
        _warned.add(kind)
    logger.warning("CPU mode: %s", detail)
    if first:
        warnings.warn(WARNING_TEXT, UserWarning, stacklevel=stacklevel)


# -- torch --------------------------------------------------------------------------------------------------------
def _gloo_for_nccl(backend: Any) -> Any:
    if isinstance(backend, str) and backend.lower() == "nccl":
        _warn_once("nccl", "an NCCL process group uses gloo")
        return "gloo"
    return backend


def _note_device_argument(call: str) -> None:
    # stack: _warn_once, here, the mode's note, its __torch_function__, the user's call
    _warn_once("device", f"CUDA device arguments place on the CPU (first: {call})", stacklevel=5)


def patch_torch() -> bool:
    """The CUDA calls and NCCL process groups of this process on the CPU, when CUDA is absent; returns whether it
    changed anything. Idempotent."""
    import torch

    if torch.cuda.is_available() or "torch" in _patched:
        return False
    import torch.distributed as dist

    from coati_compat.cpu_mode import redirect, thread_hooks

    redirect.install()
    redirect.configure(_note_device_argument)
    thread_hooks.register(redirect.activate)
    init_process_group, new_group = dist.init_process_group, dist.new_group

    def cpu_init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        return init_process_group(_gloo_for_nccl(backend), *args, **kwargs)

    def cpu_new_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = _gloo_for_nccl(kwargs["backend"])
        elif len(args) >= 3:
            args = (*args[:2], _gloo_for_nccl(args[2]), *args[3:])
        return new_group(*args, **kwargs)

    dist.init_process_group, dist.new_group = cpu_init_process_group, cpu_new_group
    _patched.add("torch")
    return True


def _cpu_hybrid_adam_class() -> type:
    import torch

    class CPUHybridAdam(torch.optim.Adam):
        """ColossalAI's ``HybridAdam`` keywords on ``torch.optim.Adam``: Adam with bias correction, decoupled weight
        decay when ``adamw_mode`` (the default), L2 otherwise; the NVMe-offload keywords are accepted and unused."""

        def __init__(self, model_params: Any, lr: float = 1e-3, bias_correction: bool = True,
                     betas: Any = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0, adamw_mode: bool = True,
                     nvme_offload_fraction: float = 0.0, nvme_offload_dir: Optional[str] = None,
                     **defaults: Any) -> None:
            if not bias_correction:
                raise ValueError(f"{ENV}=1: HybridAdam(bias_correction=False) has no CPU stand-in (torch's Adam "
                                 "always corrects the bias); leave it True or run on CUDA")
            _warn_once("hybrid_adam", "HybridAdam is torch.optim.Adam (its CPU kernel is not built here)")
            super().__init__(model_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             decoupled_weight_decay=adamw_mode)

    return CPUHybridAdam


def patch_colossalai_optimizer() -> bool:
    """``colossalai.nn.optimizer.HybridAdam`` is `CPUHybridAdam` in this process when CUDA is absent. Idempotent."""
    import torch

    if torch.cuda.is_available() or "colossalai" in _patched:
        return False
    import importlib

    stand_in = _cpu_hybrid_adam_class()
    for name in ("colossalai.nn.optimizer", "colossalai.nn.optimizer.hybrid_adam"):
        importlib.import_module(name).HybridAdam = stand_in
    _patched.add("colossalai")
    return True


# -- ray ----------------------------------------------------------------------------------------------------------
def _starts_local_cluster(address: Optional[str]) -> bool:
    address = address if address is not None else os.environ.get("RAY_ADDRESS")
    return address in (None, "", "local")


def _cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def init_kwargs(address: Optional[str], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The keywords ``ray.init`` gets in CPU mode: logical GPUs and CPUs added when it starts a local cluster."""
    if not _starts_local_cluster(address) or _cuda_present():
        return kwargs
    out = dict(kwargs)
    if out.get("num_gpus") is None:
        out["num_gpus"] = logical_gpus()
        _warn_once("init", f"the local Ray cluster declares {out['num_gpus']} logical GPUs")
    if out.get("num_cpus") is None:
        out["num_cpus"] = max(os.cpu_count() or 1, out["num_gpus"])
    return out


def check_cluster_gpus(resources: Dict[str, float]) -> None:
    """Raises when a joined cluster has no GPU resource: a GPU-era script's actors would wait forever."""
    if resources.get("GPU", 0) > 0:
        return
    raise RuntimeError(
        f"{ENV}=1: the Ray cluster this script joined has no GPU resources, so its num_gpus actors and GPU bundles "
        f"would never be placed. Start the cluster with logical GPUs and the mode in its environment, e.g. "
        f"`{ENV}=1 ray start --head --num-gpus=8`, or let the script start a local cluster (no address, "
        f"RAY_ADDRESS unset)")


def spread_strategy(strategy: str, num_bundles: int, num_nodes: int) -> str:
    """``STRICT_SPREAD`` needs a node per bundle; with fewer nodes it becomes ``SPREAD``."""
    if strategy == "STRICT_SPREAD" and num_bundles > num_nodes:
        _warn_once("spread", f"a STRICT_SPREAD placement group of {num_bundles} bundles on {num_nodes} node(s) "
                   "uses SPREAD")
        return "SPREAD"
    return strategy


def shortfall(bundles: Any, available: Dict[str, float]) -> Dict[str, float]:
    """What the bundles ask for of GPU and CPU beyond ``available`` (empty when they fit in total)."""
    out = {}
    for key in ("GPU", "CPU"):
        need = sum(float(b.get(key, 0)) for b in bundles)
        if need > available.get(key, 0):
            out[key] = need - available.get(key, 0)
    return out


def patch_ray() -> bool:
    """``ray.init`` and ``placement_group`` of this process for CPU mode (see the module docstring). Idempotent."""
    if "ray" in _patched:
        return False
    import importlib

    import ray
    import ray.util

    from coati_compat.cpu_mode import thread_hooks

    pg_module = importlib.import_module("ray.util.placement_group")  # ray.util.placement_group is also a function
    ray_init: Callable[..., Any] = ray.init
    make_pg: Callable[..., Any] = pg_module.placement_group

    def cpu_mode_init(address: Optional[str] = None, **kwargs: Any) -> Any:
        local = _starts_local_cluster(address)
        context = ray_init(address, **init_kwargs(address, kwargs))
        if not local and not _cuda_present():
            resources = ray.cluster_resources()
            if resources.get("GPU", 0) <= 0:
                ray.shutdown()
                check_cluster_gpus(resources)
        return context

    def cpu_mode_placement_group(bundles: Any, strategy: str = "PACK", *args: Any, **kwargs: Any) -> Any:
        if not _cuda_present():
            nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
            strategy = spread_strategy(strategy, len(bundles), nodes)
            short = shortfall(bundles, ray.available_resources())
            if short:
                logger.warning("CPU mode: this placement group waits for %s beyond what the cluster has free; raise "
                               "$%s (logical GPUs and CPUs of the local cluster) if nothing will free them",
                               short, GPUS_ENV)
        return make_pg(bundles, strategy, *args, **kwargs)

    cpu_mode_init.__doc__, cpu_mode_init.__wrapped__ = ray_init.__doc__, ray_init  # type: ignore[attr-defined]
    cpu_mode_placement_group.__wrapped__ = make_pg  # type: ignore[attr-defined]
    ray.init = cpu_mode_init
    pg_module.placement_group = cpu_mode_placement_group
    ray.util.placement_group = cpu_mode_placement_group
    thread_hooks.wrap_ray_actor_methods()  # threaded actors run methods in threads of Ray's own
    _patched.add("ray")
    return True


# -- start-up hook ------------------------------------------------------------------------------------------------
PATCHES = {"torch": patch_torch, "ray": patch_ray, "colossalai.nn.optimizer": patch_colossalai_optimizer}


def install() -> bool:
    """Called at interpreter start-up: when the mode is on, patches each module of `PATCHES` now if it is imported
    already, else right after its first import. Returns whether the mode is on."""
    if not enabled():
        return False
    patch_after_import(PATCHES, ENV)
    return True
