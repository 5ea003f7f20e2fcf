"""The collective weight sync without a process group: NCCL only where every member has a GPU of its own, the
weights handed over where they are (no detour through host memory), one version held at a time."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import ray
import torch
from train_round_helpers import BigramLM, make_config

from coati_relay.exchange import weight_sync_collective as wsc
from coati_relay.exchange.packing import flatten_state_dict
from coati_relay.roles.consumer import ConsumerWorker


@pytest.mark.parametrize("devices, nccl, expected", [
    (["h1/GPU-a", "h1/GPU-b", "h2/GPU-c"], True, "nccl"),
    (["h1/GPU-a", "h1/GPU-a"], True, "gloo"),    # two members on one GPU (logical GPUs): NCCL refuses it
    (["h1/GPU-a", "", "h1/GPU-b"], True, "gloo"),  # one member without CUDA: everyone uses host memory
    (["h1/GPU-a", "h1/GPU-b"], False, "gloo"),   # a torch without NCCL
    (["", ""], True, "gloo"),
])
def test_nccl_only_when_every_member_has_a_gpu_of_its_own(devices, nccl, expected):
    assert wsc.choose_backend(devices, nccl) == expected


def test_the_device_identity_names_the_physical_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert wsc.device_identity() == ""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="GPU-1234"))
    monkeypatch.setattr(wsc.socket, "gethostname", lambda: "node-a")
    assert wsc.device_identity() == "node-a/GPU-1234"


class FakeGroup:
    """A broadcast group on ``device`` that fills each receive buffer with its version number and records what
    the subscriber held when a broadcast began."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.backend = "gloo"
        self.sent, self.held_at_receive = [], []
        self.subscriber = None
        self.version = 0

    def broadcast(self, buffers):
        self.sent.append({dt: b.device for dt, b in buffers.items()})
        if self.subscriber is not None:
            self.version += 1
            self.held_at_receive.append(self.subscriber._latest)
            for b in buffers.values():
                b.fill_(self.version)


def _fake_group(monkeypatch, group):
    monkeypatch.setattr(wsc, "WeightGroup", lambda *args, **kwargs: group)
    monkeypatch.setattr(wsc, "join_store", lambda *args, **kwargs: None, raising=False)
    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)


def test_the_publisher_sends_the_weights_from_its_group_device(monkeypatch):
    """Tensors on the group's device (the GPU under NCCL; 'meta' here) are packed there: a detour through host
    memory would fail on them."""
    group = FakeGroup("meta")
    _fake_group(monkeypatch, group)
    monkeypatch.setattr(ray, "put", lambda value: value)
    store = SimpleNamespace(publish=SimpleNamespace(remote=lambda *args: None))
    pub = wsc.CollectivePublisher.__new__(wsc.CollectivePublisher)  # its group and store, without a rendezvous
    pub.store, pub.group = store, group
    assert pub.device == torch.device("meta")
    stats = pub.publish(1, tensors={"w": torch.empty(3, 4, device="meta"), "b": torch.empty(4, device="meta")})
    assert group.sent == [{"float32": torch.device("meta")}] and stats["weight_bytes"] == 16 * 4


def test_the_consumer_hands_its_publisher_the_weights_on_the_publishers_device(tiny_model_path, tmp_path):
    from coati_relay.toy import write_toy_dataset

    cfg = make_config(tiny_model_path, str(write_toy_dataset(tmp_path / "p.jsonl", num_prompts=8)), beta=0.0)
    worker = ConsumerWorker.for_models(cfg, BigramLM())
    got = {}
    worker.publisher = SimpleNamespace(device=torch.device("meta"),
                                       publish=lambda version, tensors: got.update(tensors) or {})
    worker._publish(1)
    assert {t.device.type for t in got.values()} == {"meta"}, "published from the publisher's device"


def test_the_subscriber_holds_one_version_and_hands_it_out_once(monkeypatch):
    """Version 1 arrives and is not fetched; its tensors are dropped before version 2 is received; fetch hands out
    version 2, after which the subscriber keeps no tensors."""
    group = FakeGroup()
    _fake_group(monkeypatch, group)
    flat, meta = flatten_state_dict({"w": torch.zeros(2, 3)})
    release = {2: threading.Event(), 3: threading.Event()}  # version 3: ends the receiving thread

    def wait_for(version, poll_s):
        if version in release and not release[version].wait(timeout=30):
            raise TimeoutError
        if version > 2:
            raise RuntimeError("test over")
        return SimpleNamespace(version=version, payload=[(meta, {dt: b.numel() for dt, b in flat.items()}, None)])

    store = SimpleNamespace(wait_for=SimpleNamespace(remote=wait_for))
    sub = wsc.CollectiveSubscriber.__new__(wsc.CollectiveSubscriber)
    group.subscriber = sub
    wsc.CollectiveSubscriber.__init__(sub, store, "127.0.0.1", 1, 1, 2, first_version=1, timeout_s=5)
    with sub._changed:
        assert sub._changed.wait_for(lambda: sub._latest is not None, timeout=10)
    assert sub._latest[0] == 1 and sub._latest[1] is not None
    release[2].set()
    version, tensors = sub.fetch(2, timeout_s=10)
    assert version == 2 and torch.equal(tensors["w"], torch.full((2, 3), 2.0))
    assert group.held_at_receive[0] is None and group.held_at_receive[1][:2] == (1, None), \
        "version 1's tensors were dropped before version 2 arrived"
    assert sub._latest[:2] == (2, None), "handed out: the caller holds the only reference"
    release[3].set()
