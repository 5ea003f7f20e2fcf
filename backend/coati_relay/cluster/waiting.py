"""Bounded waits: inside async Ray actors, and on the results of Ray calls (`call`, `get_within`)."""
from __future__ import annotations

import asyncio
import time
from typing import Callable, List, Optional


async def wait_until(changed: asyncio.Condition, ready: Callable[[], bool], timeout_s: Optional[float],
                     timed_out: Callable[[], BaseException],
                     check: Optional[Callable[[], None]] = None) -> None:
    """Waits on ``changed`` until ``ready()``; raises ``timed_out()`` after ``timeout_s`` (None: no bound).

    ``check()`` runs before every look at ``ready`` and may raise to end the wait early (e.g. a closed queue).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    async with changed:
        while True:
            if check is not None:
                check()
            if ready():
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise timed_out()
            try:
                await asyncio.wait_for(changed.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass


async def until_cancelled() -> None:
    """Never returns while the actor lives. A driver holds the reference of such a call (an actor's ``watch``):
    Ray fails that reference as soon as the actor dies, so one `ray.wait` notices the death within a second."""
    await asyncio.Event().wait()


def get_within(refs: List, timeout_s: float, what: str) -> List:
    """``ray.get(refs)`` within ``timeout_s``. A call whose actor died raises Ray's error at once; a timeout raises
    TimeoutError naming ``what`` and how many calls were still pending."""
    if not refs:
        return []
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        return ray.get(list(refs), timeout=timeout_s)
    except GetTimeoutError:
        _, pending = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        raise TimeoutError(f"{what}: {len(pending)} of {len(refs)} calls still pending after "
                           f"{timeout_s:.0f}s") from None


def call(method, *args, timeout_s: float, **kwargs):
    """Calls ``method``: a Ray actor's (``.remote``, then ``ray.get`` within ``timeout_s``) or a plain one in this
    process (a colocated run's in-process handles, `coati_relay.exchange.in_process`), which bounds its own waits."""
    if hasattr(method, "remote"):
        import ray

        return ray.get(method.remote(*args, **kwargs), timeout=timeout_s)
    return method(*args, **kwargs)
