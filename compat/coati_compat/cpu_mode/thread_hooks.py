"""Per-thread set-up run in every thread that runs user code, before it does, and undone when that code ends: for
per-thread state such as torch's function-mode stack (`coati_compat.cpu_mode.redirect`). Used by CPU mode.

A hook is a callable that sets the calling thread up and returns how to undo it (None when there was nothing to do,
e.g. the thread is set up already). Where it runs:

- the main thread: at `register`, never undone (the state lives until the process ends);
- threads started with ``threading`` after the first `register` (thread pools, the event loop of an async Ray
  actor): at the start of the thread, undone when it ends (a wrapper of ``threading.Thread._bootstrap_inner``);
- threads Ray's core worker starts itself, outside ``threading`` (the method threads of threaded actors,
  ``max_concurrency > 1``, and of concurrency groups; Python sees them as dummy threads): around each actor method,
  ``__init__`` included, after `wrap_ray_actor_methods` (a generator or async method's body runs after the call
  returns: in a dummy thread it is not covered, in an event-loop thread it is).

Undoing matters: torch frees a thread's mode stack as the thread exits, and a stack left holding Python objects
aborts the process ("terminate called without an active exception") when that happens during interpreter shutdown.
A thread started before the first `register` that runs no Ray actor method is not set up.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, Optional

Undo = Callable[[], None]
Hook = Callable[[], Optional[Undo]]

_hooks: List[Hook] = []
_lock = threading.Lock()
_local = threading.local()  # .undos: the undo list of the innermost scope running in this thread
_MARK = "_coati_thread_hooks"


def _in_scope(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with every hook run first in this thread, and what they did undone after."""
    outer = getattr(_local, "undos", None)
    undos: List[Undo] = []
    _local.undos = undos
    try:
        for hook in list(_hooks):
            undo = hook()
            if undo is not None:
                undos.append(undo)
        return fn(*args, **kwargs)
    finally:
        _local.undos = outer
        for undo in reversed(undos):
            undo()


def _wrap_thread_start() -> None:
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
    if getattr(bootstrap, _MARK, False):
        return

    @functools.wraps(bootstrap)
    def bootstrap_with_hooks(self: threading.Thread) -> None:
        _in_scope(bootstrap, self)

    setattr(bootstrap_with_hooks, _MARK, True)
    threading.Thread._bootstrap_inner = bootstrap_with_hooks  # type: ignore[attr-defined]


def register(hook: Hook) -> None:
    """Runs ``hook`` from now on in every thread as the module docstring says, and now in this one when it is the
    main thread or runs inside a scope of this module (then it is undone when the scope ends). Idempotent."""
    with _lock:
        if hook in _hooks:
            return
        _hooks.append(hook)
        _wrap_thread_start()
    undos = getattr(_local, "undos", None)
    if undos is not None:
        undo = hook()
        if undo is not None:
            undos.append(undo)
    elif threading.current_thread() is threading.main_thread():
        hook()


def wrap_ray_actor_methods() -> None:
    """Every Ray actor method that this process loads from now on runs inside a scope (the hooks first, their undo
    after) in the thread that runs it. Idempotent; call it before Ray loads actor classes (right after
    ``import ray``)."""
    from ray._private.function_manager import FunctionActorManager

    make_executor = FunctionActorManager._make_actor_method_executor
    if getattr(make_executor, _MARK, False):
        return

    @functools.wraps(make_executor)
    def make_executor_with_hooks(self: Any, method_name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        executor = make_executor(self, method_name, method)

        @functools.wraps(executor)  # keeps the attributes Ray reads (name, method)
        def executor_with_hooks(*args: Any, **kwargs: Any) -> Any:
            return _in_scope(executor, *args, **kwargs)

        return executor_with_hooks

    setattr(make_executor_with_hooks, _MARK, True)
    FunctionActorManager._make_actor_method_executor = make_executor_with_hooks  # type: ignore[method-assign]
