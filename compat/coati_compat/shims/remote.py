"""Ray actor classes of the legacy API: legacy ``.options(...)``/``.remote(...)`` calls on any Ray cluster.

The shim roles are plain classes (testable without Ray) that derive from `LegacyActorBase`; the legacy names are
the Ray actor classes made from them with `legacy_actor_class` (``ray.remote`` with the legacy concurrency groups).
A user's own ``@ray.remote`` subclass of ``DetachedTrainer`` gets the same treatment, because Ray builds its actor
class as a subclass of the decorated class, and `LegacyActorBase.__init_subclass__` sees it:

- ``.options(...)`` and ``.remote(...)`` warn (FutureWarning, at the caller's line) and translate resource
  requests the cluster cannot meet: on a cluster without GPUs, ``num_gpus=g`` becomes a CPU actor that reserves
  no CPU (``num_cpus=0``, unless the caller set ``num_cpus``), and a ``num_cpus`` above the cluster's total is
  lowered to it. Each translation warns once per process; nothing is dropped silently.
- Inside the actor, on a host without CUDA, ``.cuda()`` and ``torch.cuda.current_device()`` of the user's model and
  data functions go to the CPU (`coati_compat.cpu_mode.redirect`), from before the actor's ``__init__`` runs.

Named actors live in the Ray namespace named by ``RAY_NAMESPACE`` (`legacy_namespace`), as in the legacy code.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from typing import Any, ClassVar, Dict, Tuple

from coati_compat.imports.deprecations import warn_deprecated

logger = logging.getLogger(__name__)

_WARNED_TRANSLATIONS: set = set()


def enable_debug_logging(log: logging.Logger) -> None:
    """The legacy ``debug=True``: the role's debug lines go to stderr (the actor's log, forwarded to the driver)."""
    log.setLevel(logging.DEBUG)
    if not any(getattr(h, "_coati_debug", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._coati_debug = True  # type: ignore[attr-defined]
        log.addHandler(handler)


def legacy_namespace() -> str:
    """The Ray namespace of the legacy named actors: ``$RAY_NAMESPACE``; a clear error when it is unset."""
    namespace = os.environ.get("RAY_NAMESPACE")
    if not namespace:
        raise RuntimeError(
            "RAY_NAMESPACE is not set in this process. The legacy trainers and experience makers find each other "
            "by name in the Ray namespace $RAY_NAMESPACE: export RAY_NAMESPACE=<name> before starting the driver, "
            "and call ray.init(namespace=os.environ['RAY_NAMESPACE'], "
            "runtime_env={'env_vars': dict(os.environ)}) so that the actors see it too")
    return namespace


LOOKUP_WAIT_S = 5.0  # how long a lookup waits for a named actor that is not there (yet)


def get_named_actor(name: str, role: str, wait_s: float = LOOKUP_WAIT_S) -> Any:
    """``ray.get_actor(name, namespace=$RAY_NAMESPACE)``, waiting at most ``wait_s`` for an actor of that name to
    appear (the driver may create it a moment later); then an error that names what is missing and where it is."""
    import ray

    namespace = legacy_namespace()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return ray.get_actor(name, namespace=namespace)
        except ValueError as exc:
            if time.monotonic() >= deadline:
                raise RuntimeError(_missing_actor_text(name, role, namespace, wait_s)) from exc
        time.sleep(0.2)


def _missing_actor_text(name: str, role: str, namespace: str, wait_s: float) -> str:
    import ray

    named = ray.util.list_named_actors(all_namespaces=True)
    here = sorted(a["name"] for a in named if a["namespace"] == namespace)
    elsewhere = sorted(a["namespace"] for a in named if a["name"] == name and a["namespace"] != namespace)
    text = (f"no live {role} named {name!r} in Ray namespace {namespace!r} (waited {wait_s:.0f}s; the named actors "
            f"there: {here}). ")
    if elsewhere:
        return text + (f"An actor {name!r} lives in namespace {elsewhere[0]!r}: run every role with the same "
                       "RAY_NAMESPACE")
    return text + (f"Create the {role} with .options(name={name!r}) in that namespace before it is needed, or correct "
                   "the name in the list of names given to this role")


def build_strategy(strategy_fn: Any, who: str) -> Any:
    """``strategy_fn()``, checked to be a legacy strategy (it has ``model_init_context`` and ``prepare``)."""
    if not callable(strategy_fn):
        raise TypeError(f"{who}: strategy_fn must be a callable that returns a strategy (e.g. NaiveStrategy, or "
                        f"lambda: DDPStrategy()), got {type(strategy_fn).__name__} {strategy_fn!r:.80}")
    strategy = strategy_fn()
    missing = [m for m in ("model_init_context", "prepare") if not callable(getattr(strategy, m, None))]
    if missing:
        raise TypeError(f"{who}: strategy_fn returned {type(strategy).__name__} {strategy!r:.80}, not a strategy "
                        f"(it lacks {missing}); return one of coati.trainer.strategies (e.g. NaiveStrategy())")
    return strategy


def cluster_resources() -> Tuple[float, float]:
    """(CPUs, GPUs) of the Ray cluster, or of this host when Ray is not started yet (Ray then starts locally)."""
    import ray

    if ray.is_initialized():
        total = ray.cluster_resources()
        return float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0))
    import torch

    return float(os.cpu_count() or 1), float(torch.cuda.device_count() if torch.cuda.is_available() else 0)


def _warn_once(key: str, text: str) -> None:
    if key in _WARNED_TRANSLATIONS:
        return
    _WARNED_TRANSLATIONS.add(key)
    logger.warning(text)
    warnings.warn(text, UserWarning, stacklevel=4)


def translate_actor_options(options: Dict[str, Any], cpus: float, gpus: float,
                            who: str = "actor") -> Dict[str, Any]:
    """Actor options that a cluster of ``cpus`` CPUs and ``gpus`` GPUs can place; pure apart from the warnings.

    ``num_gpus > 0`` without GPUs: removed, and ``num_cpus`` set to 0 when the caller did not set it (the actor
    shares the CPUs instead of reserving one, so four legacy actors fit on two cores). ``num_cpus`` above ``cpus``:
    lowered to ``cpus``. Everything else passes through unchanged.
    """
    out = dict(options)
    num_gpus = out.get("num_gpus")
    if num_gpus is not None and num_gpus > 0 and gpus <= 0:
        del out["num_gpus"]
        out.setdefault("num_cpus", 0)
        _warn_once("num_gpus", f"the Ray cluster has no GPU: num_gpus={num_gpus} of {who} is translated to a CPU "
                               f"actor with num_cpus={out['num_cpus']}; inside it, legacy .cuda() calls stay on "
                               f"the CPU")
    num_cpus = out.get("num_cpus")
    if num_cpus is not None and cpus > 0 and num_cpus > cpus:
        out["num_cpus"] = cpus
        _warn_once("num_cpus", f"num_cpus={num_cpus} of {who} exceeds the {cpus:g} CPUs of the Ray cluster; "
                               f"lowered to {cpus:g}")
    return out


def in_ray_actor() -> bool:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().get_actor_id() is not None


def _is_ray_actor_class(cls: type) -> bool:
    actor_module = sys.modules.get("ray.actor")
    return actor_module is not None and issubclass(cls, actor_module.ActorClass)


def _install_legacy_remote(actor_cls: type) -> None:
    """Gives a Ray actor class built from a `LegacyActorBase` subclass the legacy `.options`/`.remote`."""
    from ray.actor import ActorClass

    def _who(self: Any, options: Dict[str, Any]) -> str:
        class_name = self.__ray_metadata__.class_name
        return f"{class_name}(name={options['name']!r})" if options.get("name") else class_name

    def options(self: Any, **actor_options: Any) -> Any:
        warn_deprecated(self._legacy_name)
        cpus, gpus = cluster_resources()
        return ActorClass.options(self, **translate_actor_options(actor_options, cpus, gpus,
                                                                  _who(self, actor_options)))

    def remote(self: Any, *args: Any, **kwargs: Any) -> Any:
        warn_deprecated(self._legacy_name)
        defaults = {k: v for k, v in self._default_options.items() if k != "concurrency_groups"}
        cpus, gpus = cluster_resources()
        translated = translate_actor_options(defaults, cpus, gpus, _who(self, defaults))
        if translated != defaults:
            return ActorClass.options(self, **translated).remote(*args, **kwargs)
        return ActorClass.remote(self, *args, **kwargs)

    options.__doc__ = ActorClass.options.__doc__
    remote.__doc__ = ActorClass.remote.__doc__
    actor_cls.options = options
    actor_cls.remote = remote


class LegacyActorBase:
    """Base of the legacy roles. ``_legacy_name`` is the deprecation-table name warned at ``.options()``/``.remote()``
    of the Ray actor classes made from subclasses."""

    _legacy_name: ClassVar[str] = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Runs before any user __init__ (a DetachedTrainer subclass may call .cuda() before super().__init__()).
        if not _is_ray_actor_class(cls) and in_ray_actor():
            from coati_compat.cpu_mode import redirect

            redirect.install()
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _is_ray_actor_class(cls):
            _install_legacy_remote(cls)


def legacy_actor_class(impl: type, concurrency_groups: Dict[str, int]) -> Any:
    """The Ray actor class of ``impl`` (a `LegacyActorBase` subclass) with the legacy concurrency groups.

    The result is a real ``ray.actor.ActorClass`` whose ``.options``/``.remote`` warn and translate resources; it is
    marked deprecated (PEP 702 ``__deprecated__``) with the table's text.
    """
    import ray

    from coati_compat.imports.deprecations import message

    if not (isinstance(impl, type) and issubclass(impl, LegacyActorBase) and impl._legacy_name):
        raise TypeError(f"legacy_actor_class needs a LegacyActorBase subclass with _legacy_name, got {impl!r}")
    actor_cls = ray.remote(concurrency_groups=dict(concurrency_groups))(impl)
    actor_cls.__deprecated__ = message(impl._legacy_name)
    return actor_cls
