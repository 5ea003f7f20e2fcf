"""Full weights through a run's shared-memory file: two slots taking turns, a seqlock that refuses a slot being
written or overwritten, the object-store pair announcing a ticket instead of a Ray object, and the fallback."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from coati_relay.exchange.shared_weights import (
    SHM_DIR,
    SlotReader,
    SlotTicket,
    SlotWriter,
    remove_shared_weights,
    shared_weights_path,
)

needs_shm = pytest.mark.skipif(not (SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)), reason="no writable /dev/shm")
pytestmark = needs_shm


def weights(scale: float):
    """Every dtype a checkpoint holds, with sizes that do not fill a 64-byte line."""
    return {"w": torch.full((3, 5), scale), "b": torch.full((7,), scale).bfloat16(),
            "h": torch.full((2, 3), scale).half(), "ids": torch.arange(5) * int(scale)}


def assert_weights(got, scale: float):
    want = weights(scale)
    assert list(got) == list(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k


@pytest.fixture
def path(tmp_path):
    p = str(SHM_DIR / f"coati-relay-weights-test-{os.getpid()}-{tmp_path.name}")
    yield p
    remove_shared_weights(p)
    assert not Path(p).exists()


def test_versions_take_turns_in_two_slots_and_read_back_whole(path):
    writer, reader = SlotWriter(path), SlotReader()
    first = writer.write(1, weights(1.0))
    second = writer.write(2, weights(2.0))
    assert (first.slot, second.slot) == (1, 0) and first.file_bytes == Path(path).stat().st_size
    assert_weights(reader.read(first), 1.0)
    got = reader.read(second)
    assert_weights(got, 2.0)
    writer.write(3, weights(3.0))
    assert_weights(got, 2.0)  # what a read returned is the reader's own copy: a later write leaves it


def test_a_slot_overwritten_or_being_written_is_refused(path):
    writer, reader = SlotWriter(path), SlotReader()
    first = writer.write(1, weights(1.0))
    writer.write(2, weights(2.0))
    third = writer.write(3, weights(3.0))  # slot 1 again: version 1 is gone
    assert reader.read(first) is None
    reader.read(third)
    reader._mapped.header[third.slot, 0] += 1  # as a writer between its two marks
    assert reader.read(third) is None
    reader._mapped.header[third.slot, 0] += 1
    assert_weights(reader.read(third), 3.0)


def test_a_new_layout_makes_a_new_file_that_readers_follow(path):
    writer, reader = SlotWriter(path), SlotReader()
    assert_weights(reader.read(writer.write(1, weights(1.0))), 1.0)
    bigger = {**weights(2.0), "extra": torch.ones(100)}
    got = reader.read(writer.write(2, bigger))
    assert torch.equal(got["extra"], torch.ones(100)) and torch.equal(got["w"], bigger["w"])


def test_no_room_in_dev_shm_writes_nothing(path, monkeypatch):
    monkeypatch.setattr(SlotWriter, "room_for", staticmethod(lambda file_bytes: False))
    assert SlotWriter(path).write(1, weights(1.0)) is None and not Path(path).exists()


@pytest.mark.slow
def test_the_object_store_pair_announces_a_ticket_and_falls_back_without_room(ray_cluster, path, monkeypatch):
    """Through the real weight store actor: the store holds a small ticket, not a Ray object; a subscriber asked for
    a version that was overwritten while it read gets the newest instead; without room in /dev/shm the publisher
    warns once and sends every later version through the object store."""
    from coati_relay.exchange.weight_store import make_weight_store
    from coati_relay.exchange.weight_sync import ObjectStorePublisher, ObjectStoreSubscriber

    made = shared_weights_path("a project/name")
    assert made is not None and made.startswith(str(SHM_DIR / "coati-relay-weights-a_project_name-")), made
    assert not Path(made).exists(), "naming the file makes nothing"
    store = make_weight_store()
    pub, sub = ObjectStorePublisher(store, shared_path=path), ObjectStoreSubscriber(store)
    stats = pub.publish(1, tensors=weights(1.0))
    assert stats["weight_bytes"] == sum(t.numel() * t.element_size() for t in weights(1.0).values())
    assert isinstance(ray_cluster.get(store.wait_for.remote(1), timeout=10).payload[0], SlotTicket)
    version, got = sub.fetch(1, timeout_s=10)
    assert version == 1
    assert_weights(got, 1.0)

    stale = sub._slots.read
    calls = []

    def overwritten_once(ticket):  # the first read finds its slot overwritten, as when a round goes by meanwhile
        calls.append(ticket.version)
        return None if len(calls) == 1 else stale(ticket)

    monkeypatch.setattr(sub._slots, "read", overwritten_once)
    pub.publish(2, tensors=weights(2.0))
    version, got = sub.fetch(2, timeout_s=10)
    assert calls == [2, 2] and version == 2
    assert_weights(got, 2.0)
    monkeypatch.setattr(sub._slots, "read", stale)

    monkeypatch.setattr(SlotWriter, "room_for", staticmethod(lambda file_bytes: False))
    pub.slots = SlotWriter(path + "-other")
    with pytest.warns(RuntimeWarning, match="no room"):
        pub.publish(3, tensors=weights(3.0))
    assert pub.slots is None
    payload = ray_cluster.get(store.wait_for.remote(3), timeout=10).payload[0]
    assert isinstance(payload, ray_cluster.ObjectRef)
    version, got = sub.fetch(3, timeout_s=10)
    assert version == 3
    assert_weights(got, 3.0)
