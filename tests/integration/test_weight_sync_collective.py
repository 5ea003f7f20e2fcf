"""Collective WeightSync: rank 0 broadcasts every version (gloo here, NCCL where every member has CUDA);
subscribers receive each one in order."""
from __future__ import annotations

import threading

import pytest
import torch

from coati_relay.exchange.weight_store import make_weight_store
from coati_relay.exchange.weight_sync_collective import CollectivePublisher, CollectiveSubscriber, choose_backend
from coati_relay.training.rendezvous import host_store

pytestmark = pytest.mark.slow


def _pair(store, base=None, first_version=1):
    """A publisher (rank 0) and a subscriber (rank 1) in this process; each constructor waits for the other."""
    hosted = host_store(2, timeout_s=60)
    made = {}
    sub = threading.Thread(target=lambda: made.setdefault("sub", CollectiveSubscriber(
        store, "127.0.0.1", hosted.port, 1, 2, first_version, timeout_s=60, base_weights=base)))
    sub.start()
    pub = CollectivePublisher(store, hosted, 2, timeout_s=60)
    sub.join(timeout=60)
    return pub, made["sub"]


@pytest.mark.parametrize("members, nccl, expected", [
    (["h/GPU-a", "h/GPU-b", "h/GPU-c"], True, "nccl"),
    (["h/GPU-a", "", "h/GPU-c"], True, "gloo"),  # one producer without CUDA: everyone falls back to host memory
    (["h/GPU-a", "h/GPU-a"], True, "gloo"),      # two members on one GPU, which NCCL refuses
    (["h/GPU-a", "h/GPU-b"], False, "gloo"),     # a torch without NCCL
    (["", ""], True, "gloo"),
])
def test_the_backend_is_nccl_only_when_every_member_has_a_gpu_of_its_own(members, nccl, expected):
    assert choose_backend(members, nccl) == expected


def test_every_version_arrives_with_its_dtypes(ray_cluster):
    pub, sub = _pair(make_weight_store())
    assert pub.group.backend == sub.group.backend == ("nccl" if torch.cuda.is_available() else "gloo")
    with pytest.raises(TimeoutError, match="version >= 1"):
        sub.fetch(1, timeout_s=0.5)
    sd = {"w": torch.randn(3, 4), "h": torch.randn(5).bfloat16(), "n": torch.arange(4)}
    stats = pub.publish(1, tensors=sd)
    assert stats["weight_bytes"] == 12 * 4 + 5 * 2 + 4 * 8
    version, got = sub.fetch(1, timeout_s=30)
    assert version == 1
    for k, v in sd.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v)
    pub.publish(2, tensors={k: v + 1 for k, v in sd.items()})
    version, got = sub.fetch(2, timeout_s=30)
    assert version == 2 and torch.equal(got["n"], sd["n"] + 1)


def test_lora_adapters_are_merged_onto_the_base(ray_cluster):
    base = {"w": torch.zeros(2, 3)}
    pub, sub = _pair(make_weight_store(), base=base)
    pub.publish(1, adapters={"w": (torch.ones(1, 3), torch.ones(2, 1), 0.5)})
    _, got = sub.fetch(1, timeout_s=30)
    assert torch.equal(got["w"], torch.full((2, 3), 0.5)) and torch.equal(base["w"], torch.zeros(2, 3))
    with pytest.raises(ValueError, match="exactly one"):
        pub.publish(2)
