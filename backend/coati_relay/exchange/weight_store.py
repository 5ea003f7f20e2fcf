"""The weight store: a Ray actor that holds the newest published weight version (object references only).

Kept free of torch, so that the store's process starts without importing it (`weight_sync` holds the tensor side).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from coati_relay.cluster.placement import SERVICE_ACTOR_OPTIONS, ServiceActor
from coati_relay.cluster.waiting import wait_until


@dataclass
class PublishedWeights:
    version: int
    payload: List[Any]  # [ObjectRef of (buffers, meta, lora)]
    kind: str  # "full" | "lora"
    nbytes: int
    publish_time: float


class WeightStoreActor(ServiceActor):
    """Async Ray actor holding the newest published version; producers wait on it with a timeout."""

    def __init__(self):
        self.latest: Optional[PublishedWeights] = None
        self._changed = asyncio.Condition()

    async def publish(self, version: int, payload: List[Any], kind: str, nbytes: int) -> None:
        if self.latest is not None and version <= self.latest.version:
            raise ValueError(f"WeightStore: version {version} is not newer than {self.latest.version}")
        self.latest = PublishedWeights(version, payload, kind, nbytes, time.time())
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, min_version: int, timeout_s: Optional[float] = None) -> PublishedWeights:
        """The newest version once it is ``>= min_version``; TimeoutError after ``timeout_s``."""
        def timed_out() -> TimeoutError:
            have = None if self.latest is None else self.latest.version
            return TimeoutError(f"WeightStore: waited {timeout_s:.1f}s for version >= {min_version}, newest is {have}")

        await wait_until(self._changed, lambda: self.latest is not None and self.latest.version >= min_version,
                         timeout_s, timed_out)
        return self.latest

    def latest_version(self) -> Optional[int]:
        return None if self.latest is None else self.latest.version


def make_weight_store(name: Optional[str] = None, namespace: Optional[str] = None, **options: Any):
    """Starts a `WeightStoreActor` (no CPU reserved) and returns its handle; ``options``: more Ray actor options."""
    import ray

    opts: Dict[str, Any] = {**SERVICE_ACTOR_OPTIONS, **options}
    if name:
        opts["name"] = name
    if namespace:
        opts["namespace"] = namespace
    return ray.remote(WeightStoreActor).options(**opts).remote()
