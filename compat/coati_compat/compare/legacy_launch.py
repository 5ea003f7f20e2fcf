"""The legacy side of ``coati-relay compare``: ``python -m coati_compat.compare.legacy_launch SCRIPT [ARGS...]``.

Runs SCRIPT unchanged as ``coati-relay legacy-run`` does (CPU mode, which changes nothing on a host with CUDA), with
``$COATI_RELAY_COMPARE_EVENTS`` set by the caller: the shims record through their observers, and every Ray worker
of the job installs `function_recording` first (``ray.init`` gets it as ``worker_process_setup_hook``, chained
after a hook the script sets itself).
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from typing import Any, Callable, Optional, Union

from coati_compat.compare import function_recording, recording_switch

logger = logging.getLogger(__name__)

SETUP_HOOK = "coati_compat.compare.function_recording.install"


def _call_hook(hook: Union[str, Callable[[], Any]]) -> None:
    if callable(hook):
        hook()
        return
    module, _, name = hook.rpartition(".")
    getattr(importlib.import_module(module), name)()


def _both_hooks(user_hook: Union[str, Callable[[], Any]]) -> None:
    function_recording.install()
    _call_hook(user_hook)


def with_setup_hook(runtime_env: Optional[dict]) -> dict:
    """``runtime_env`` with the recording hook as ``worker_process_setup_hook`` (before the script's own)."""
    env = dict(runtime_env or {})
    user_hook = env.get("worker_process_setup_hook")
    env["worker_process_setup_hook"] = functools.partial(_both_hooks, user_hook) if user_hook else SETUP_HOOK
    return env


def wrap_ray_init() -> None:
    """Makes ``ray.init`` of this process pass `with_setup_hook` of the script's ``runtime_env``."""
    import ray

    original = ray.init

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        kwargs["runtime_env"] = with_setup_hook(kwargs.get("runtime_env"))
        return original(*args, **kwargs)

    ray.init = init


def main(argv: Optional[list] = None) -> int:
    from coati_compat import legacy_run

    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m coati_compat.compare.legacy_launch SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    if not recording_switch.events_dir():
        print(f"legacy_launch: set ${recording_switch.ENV} to the directory the records go to", file=sys.stderr)
        return 2
    os.environ.update(recording_switch.recording_env(recording_switch.events_dir()))
    wrap_ray_init()
    return legacy_run.run_script(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
