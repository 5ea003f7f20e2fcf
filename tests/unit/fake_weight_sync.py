"""A fake weight sync, ``"fake_sync"``, for tests/unit/test_backend_registry.py: the object store's publisher and
subscriber under its own name and spec, whose colocated publisher records every version it hands over."""
from __future__ import annotations

from dataclasses import replace
from typing import List

from coati_relay.exchange.in_process import InProcessPublisher
from coati_relay.exchange.sync_registry import weight_sync_spec

PUBLISHED: List[int] = []  # the versions handed to a colocated backend


class RecordingPublisher(InProcessPublisher):
    """`InProcessPublisher` that records each version."""

    def publish(self, version, tensors=None, adapters=None, timeout_s=120.0):
        PUBLISHED.append(version)
        return super().publish(version, tensors, adapters, timeout_s)


SPEC = replace(weight_sync_spec("object_store"), name="fake_sync", colocated_publisher=RecordingPublisher)
