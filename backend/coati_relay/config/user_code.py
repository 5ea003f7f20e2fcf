"""User rewards, advantage estimators, losses and KL estimators, carried to every actor by value.

A reward (``@register_reward``), an advantage estimator (``@register("advantage", ...)``), a policy or value loss or
a KL estimator (``@register("policy_loss", ...)``, ``"value_loss"``, ``"kl"``) registered in the driver, in the
user's ``__main__`` script or in a module only the driver can import, passes the driver's checks; the actors are
other interpreters that never ran that registration. `UserCode` holds the entries a run uses that do
not come with coati-relay, pickled once in the driver and by value (cloudpickle): the function's code travels, and
so does everything its own top-level package defines; other imports travel by reference, as do modules installed
in site-packages (install those on every node). Unpickling a `UserCode` registers its entries in the actor. Ray
unpickles the run config an actor gets before the actor's constructor runs, so the registry lookups in the
producers and consumers find them.

A user callable given directly (``grpo_config["reward_fn"]``) travels by value through `ByValue`.
"""
from __future__ import annotations

import functools
import logging
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

ENGINE_PACKAGES = ("coati_relay", "coati_compat")  # every actor imports these: their entries need no shipping
KINDS = ("reward", "advantage", "policy_loss", "value_loss", "kl")
# grpo_config settings that name a registered function, by kind (core_algo names the "advantage" one).
NAMED_BY = {"policy_loss": "policy_loss", "value_loss": "value_loss", "kl": "kl_estimator"}


class UserCodeError(ValueError):
    """A user callable cannot be sent to the actors; the message names it and says what to change."""


def _target(fn: Callable) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def module_name(fn: Callable) -> Optional[str]:
    """The name of the module that defines ``fn`` (a function, a partial of one, or a callable object)."""
    target = _target(fn)
    name = getattr(target, "__module__", None)
    return name if isinstance(name, str) else type(target).__module__


def _installed(module_name_: str) -> bool:
    """True for the standard library and modules under site-packages: importable wherever the environment is."""
    module = sys.modules.get(module_name_)
    path = getattr(module, "__file__", None)
    if module is None or path is None:
        return module is not None and module_name_ in sys.builtin_module_names
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(Path(r).resolve()) for r in roots)


def comes_with_engine(fn: Callable) -> bool:
    """True when ``fn`` is defined inside coati-relay, which every actor imports."""
    name = module_name(fn) or ""
    return name.split(".")[0] in ENGINE_PACKAGES


def dumps_by_value(obj: Any, fn: Callable, what: str) -> bytes:
    """cloudpickle bytes of ``obj``, with the top-level package of ``fn``'s module pickled by value.

    ``what`` names ``fn`` in the error raised when it cannot be pickled (a lock, an open file, a live model...)."""
    from ray import cloudpickle

    top = (module_name(fn) or "__main__").split(".")[0]
    module = sys.modules.get(top)
    by_value = (module is not None and top != "__main__" and not _installed(top)
                and top not in cloudpickle.list_registry_pickle_by_value())
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:
        raise UserCodeError(f"{what} cannot be sent to the actors ({type(exc).__name__}: {exc}); the actors get "
                            f"the function by value, with what it refers to: keep unpicklable objects (locks, open "
                            f"files, models) out of its module's globals, or create them inside the function") \
            from exc
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


@dataclass(frozen=True)
class Entry:
    """A registry entry: ``kind`` one of `KINDS`; ``spec`` the estimator's AlgorithmSpec (advantage only)."""

    kind: str
    name: str
    fn: Callable
    spec: Any = None


def _register(entry: Entry) -> None:
    """Registers ``entry`` in this process unless its name is taken (then the one already here stays)."""
    if entry.kind == "reward":
        from coati_relay.rewards.registry import register_reward, reward_names

        taken = entry.name in reward_names()
        if not taken:
            register_reward(entry.name)(entry.fn)
    else:
        from coati_relay import algorithms

        taken = entry.name.lower() in algorithms.names(entry.kind)
        if not taken:
            algorithms.register(entry.kind, entry.name, spec=entry.spec)(entry.fn)
    if taken:
        log.debug("%s %r is registered here already; keeping this process's own", entry.kind, entry.name)


def _install(blobs: Tuple[bytes, ...]) -> "UserCode":
    """Unpickling a `UserCode` (in an actor): registers each entry, returns the `UserCode`."""
    from ray import cloudpickle

    entries = [cloudpickle.loads(blob) for blob in blobs]
    for entry in entries:
        _register(entry)
    return UserCode(entries, blobs)


class UserCode:
    """User registry entries a run needs in every actor; pickling sends them by value, unpickling registers them."""

    def __init__(self, entries: Sequence[Entry] = (), blobs: Optional[Tuple[bytes, ...]] = None):
        self.entries: Tuple[Entry, ...] = tuple(entries)
        self.blobs = blobs if blobs is not None else tuple(
            dumps_by_value(e, e.fn, f"{e.kind} {e.name!r} ({module_name(e.fn)}.{_qualname(e.fn)})")
            for e in self.entries)

    def __reduce__(self):
        return _install, (self.blobs,)

    def __repr__(self) -> str:
        return f"UserCode({[f'{e.kind}:{e.name}' for e in self.entries]})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UserCode) and self.blobs == other.blobs

    def __hash__(self) -> int:
        return hash(self.blobs)

    def install(self) -> None:
        """Registers the entries in this process (what unpickling does in an actor)."""
        for entry in self.entries:
            _register(entry)


def _qualname(fn: Callable) -> str:
    target = _target(fn)
    return getattr(target, "__qualname__", type(target).__qualname__)


class ByValue:
    """A user callable that pickles by value; it unpickles as the plain callable. Calls go to the callable."""

    def __init__(self, fn: Callable, what: str):
        self.fn = fn
        self.blob = dumps_by_value(fn, fn, what)
        functools.update_wrapper(self, _target(fn))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        from ray import cloudpickle

        return cloudpickle.loads, (self.blob,)


def user_entries(reward: Any, core_algo: Optional[str], algo: Any = None) -> List[Entry]:
    """The registry entries of the run's reward (a registered name), estimator (``core_algo``) and, from ``algo``
    (an `AlgorithmConfig`), losses and KL estimator that do not come with coati-relay (call after each was checked
    to exist)."""
    entries = []
    if isinstance(reward, str):
        from coati_relay.rewards.registry import registered_reward

        fn = registered_reward(reward)
        if not comes_with_engine(fn):
            entries.append(Entry("reward", reward, fn))
    if isinstance(core_algo, str):
        from coati_relay import algorithms

        fn = algorithms.get("advantage", core_algo)
        if not comes_with_engine(fn):
            entries.append(Entry("advantage", core_algo.lower(), fn, algorithms.spec(core_algo)))
    if algo is not None:
        from coati_relay import algorithms

        for kind, setting in NAMED_BY.items():
            name = getattr(algo, setting).lower()
            fn = algorithms.get(kind, name)
            if not comes_with_engine(fn):
                entries.append(Entry(kind, name, fn))
    return entries
