"""WeightSync: flat buffers per dtype, versions, LoRA-only payloads rebuilt as W0 + scaling * B @ A."""
from __future__ import annotations

import pytest
import torch

from coati_relay.exchange.lora_deltas import lora_adapters, merge_lora
from coati_relay.exchange.packing import flatten_state_dict, unflatten_state_dict
from coati_relay.exchange.weight_store import make_weight_store
from coati_relay.exchange.weight_sync import ObjectStorePublisher, ObjectStoreSubscriber


def test_flatten_round_trip_keeps_dtypes_and_shapes():
    sd = {"w": torch.randn(3, 4), "b": torch.randn(4), "ids": torch.arange(5), "h": torch.randn(2, 2).half()}
    buffers, meta = flatten_state_dict(sd)
    assert sorted(buffers) == ["float16", "float32", "int64"]
    assert buffers["float32"].numel() == 16
    back = unflatten_state_dict(buffers, meta)
    assert set(back) == set(sd)
    for k in sd:
        assert back[k].dtype == sd[k].dtype and torch.equal(back[k], sd[k])


def test_flatten_into_earlier_buffers_fills_them_in_place():
    """A publisher packs the same weights every round: given the last round's buffers, flatten fills those of the same
    dtype and size instead of allocating new ones, and allocates where the size changed."""
    sd = {"w": torch.randn(3, 4), "b": torch.randn(4), "ids": torch.arange(5)}
    first, _ = flatten_state_dict(sd)
    pointers = {dt: b.data_ptr() for dt, b in first.items()}
    moved = {k: v + 1 for k, v in sd.items()}
    second, meta = flatten_state_dict(moved, into=first)
    assert {dt: b.data_ptr() for dt, b in second.items()} == pointers
    assert all(torch.equal(v, moved[k]) for k, v in unflatten_state_dict(second, meta).items())
    grown, _ = flatten_state_dict({**moved, "w": torch.randn(4, 4)}, into=second)
    assert grown["float32"].numel() == 20 and grown["int64"].data_ptr() == pointers["int64"]


def test_merge_lora_replaces_instead_of_accumulating():
    base = {"w": torch.zeros(2, 2)}
    a, b = torch.ones(1, 2), torch.ones(2, 1)
    first = merge_lora(base, {"w": (a, b, 0.5)})
    second = merge_lora(base, {"w": (a, b, 0.5)})
    assert torch.equal(first["w"], torch.full((2, 2), 0.5))
    assert torch.equal(second["w"], first["w"]), "a second sync of the same adapters must not add them again"
    assert torch.equal(base["w"], torch.zeros(2, 2)), "the base weights stay untouched"
    with pytest.raises(KeyError, match="missing"):
        merge_lora(base, {"missing.weight": (a, b, 1.0)})


def test_lora_adapters_rebuild_the_trained_weights(tiny_model_path):
    from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm

    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    backend = TrainingBackend(load_causal_lm(tiny_model_path, lora=lora), lr=1e-2)
    ids = torch.randint(3, 300, (2, 10))
    backend.backward(backend.model(input_ids=ids, labels=ids).loss)
    backend.step()
    adapters = lora_adapters(backend.unwrapped())
    assert adapters and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in adapters)
    base = load_causal_lm(tiny_model_path).state_dict()
    merged = merge_lora(base, adapters)
    full = backend.state_dict_for_inference()
    for name, w in merged.items():
        torch.testing.assert_close(w, full[name], rtol=1e-5, atol=1e-6)
    changed = [n for n in merged if not torch.allclose(merged[n], base[n])]
    assert changed, "one optimizer step must move the adapted weights"


@pytest.mark.slow
def test_publish_and_fetch_through_ray(ray_cluster):
    store = make_weight_store()
    pub = ObjectStorePublisher(store)
    sub = ObjectStoreSubscriber(store)
    with pytest.raises(TimeoutError, match="version >= 1"):
        sub.fetch(1, timeout_s=0.5)
    stats = pub.publish(1, tensors={"w": torch.ones(2, 3), "n": torch.arange(3)})
    assert stats["weight_bytes"] == 2 * 3 * 4 + 3 * 8
    version, tensors = sub.fetch(1, timeout_s=10)
    assert version == 1 and torch.equal(tensors["w"], torch.ones(2, 3)) and tensors["n"].dtype == torch.int64
    with pytest.raises(Exception, match="not newer"):
        pub.publish(1, tensors={"w": torch.ones(1)})
    with pytest.raises(ValueError, match="exactly one"):
        pub.publish(2)
    pub.publish(2, adapters={"w": (torch.ones(1, 3), torch.ones(2, 1), 1.0)})
    lora_sub = ObjectStoreSubscriber(store, base_weights={"w": torch.zeros(2, 3)})
    version, tensors = lora_sub.fetch(2, timeout_s=10)
    assert version == 2 and torch.equal(tensors["w"], torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="base weights"):
        sub.fetch(2, timeout_s=10)


def test_wire_format_round_trips_every_dtype():
    from coati_relay.exchange.packing import _from_wire, _to_wire

    sd = {"f": torch.randn(4), "b": torch.randn(3).bfloat16(), "h": torch.randn(2).half(), "i": torch.arange(3)}
    buffers, meta = flatten_state_dict(sd)
    back = unflatten_state_dict(_from_wire(_to_wire(buffers)), meta)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)


def test_packed_state_dict_reads_as_the_state_dict_it_packs():
    import pickle

    from coati_relay.exchange.packing import PackedStateDict

    sd = {"w": torch.randn(3, 2).half(), "b": torch.randn(2).bfloat16(), "ids": torch.arange(4)}
    packed = pickle.loads(pickle.dumps(PackedStateDict(sd)))  # as a maker receives it
    assert len(packed) == 3 and list(packed) == list(sd) and "w" in packed
    assert all(packed[k].dtype == v.dtype and torch.equal(packed[k], v) for k, v in sd.items())
    layer = torch.nn.Linear(2, 3, bias=False).half()
    layer.load_state_dict({"weight": packed["w"]})
    assert torch.equal(layer.weight, sd["w"])


@pytest.mark.slow
def test_versions_packed_into_one_host_buffer_stay_apart_in_the_object_store(ray_cluster):
    """The publisher packs every version into the buffers of the last one; the object store holds a copy of each,
    so a version already published keeps its numbers when the next one is packed."""
    store = make_weight_store()
    pub, sub = ObjectStorePublisher(store), ObjectStoreSubscriber(store)
    pub.publish(1, tensors={"w": torch.ones(2, 3)})
    host = pub._host["float32"].data_ptr()
    first = ray_cluster.get(store.wait_for.remote(1), timeout=10).payload[0]
    pub.publish(2, tensors={"w": torch.full((2, 3), 2.0)})
    assert pub._host["float32"].data_ptr() == host, "the second version reused the first one's host buffer"
    assert torch.equal(ray_cluster.get(first, timeout=10)["w"], torch.ones(2, 3))
    version, tensors = sub.fetch(2, timeout_s=10)
    assert version == 2 and torch.equal(tensors["w"], torch.full((2, 3), 2.0))
