"""The legacy buffer hands experience off once: the items a trainer receives stay in its process until sampled."""
from __future__ import annotations

import pytest
import torch

from coati_compat.legacy.experience import Experience, split_experience_batch
from coati_compat.shims.replay_buffer import DetachedReplayBuffer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _batch(ids) -> Experience:
    ids = torch.as_tensor(ids, dtype=torch.long)
    b = ids.numel()
    return Experience(sequences=ids[:, None].repeat(1, 5), action_log_probs=torch.zeros(b, 2), values=ids.float(),
                      reward=ids.float(), advantages=ids.float()[:, None],
                      attention_mask=torch.ones(b, 5, dtype=torch.long), action_mask=torch.ones(b, 2).bool())


@pytest.mark.slow
def test_extend_to_sample_makes_no_actor_and_no_object_store_trip(ray_cluster, monkeypatch):
    ray = ray_cluster
    calls = {"ray.put": 0, "ray.get": 0, "actor started": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(ray, "put", counting("ray.put", ray.put))
    monkeypatch.setattr(ray, "get", counting("ray.get", ray.get))
    monkeypatch.setattr(ray.actor.ActorClass, "_remote", counting("actor started", ray.actor.ActorClass._remote))
    items = split_experience_batch(_batch([3, 4, 5, 6]))  # as a maker's buffer_extend call delivers them
    buf = DetachedReplayBuffer(2, limit=1, wait_timeout_s=5)
    buf.set_throttle(False)
    buf.extend(items)
    first, second = buf.sample(), buf.sample()
    assert first.sequences[:, 0].tolist() == [3, 4] and second.sequences[:, 0].tolist() == [5, 6]
    buf.clear()
    assert calls == {"ray.put": 0, "ray.get": 0, "actor started": 0}
    assert buf.counters()["consumed"] == 2


def test_an_item_carries_only_its_own_bytes_to_the_trainer():
    """A maker's items go to the trainer pickled (``buffer_extend``'s arguments): each must hold its own row only."""
    import pickle

    batch = _batch(range(8))
    batch.sequences = torch.arange(8 * 4096).reshape(8, 4096)  # 32 KiB a row, 256 KiB the batch
    items = split_experience_batch(batch)
    assert torch.equal(torch.stack([it.sequences for it in items]), batch.sequences)
    row_bytes = 4096 * 8
    sizes = [len(pickle.dumps(it.sequences)) for it in items]
    assert max(sizes) < 2 * row_bytes, f"an item's sequences pickle to {max(sizes)} bytes, its row has {row_bytes}"
    whole = [len(pickle.dumps(it)) for it in items]  # the item as it travels: its tensors as numpy arrays
    assert max(whole) < 2 * row_bytes, f"an item pickles to {max(whole)} bytes, its row has {row_bytes}"


def test_items_and_batches_travel_as_arrays_and_leave_no_cyclic_garbage(cyclic_garbage):
    """torch's own pickling of a tensor defines a class per call (cyclic garbage until a full collection); the
    legacy items and batches pickle their tensors as numpy arrays and come back equal, masks of None included."""
    import pickle

    from coati_compat.legacy.experience import BufferItem

    batch = _batch(range(4))
    batch.action_mask = None
    items = split_experience_batch(batch)
    (back_items, back_batch), garbage = cyclic_garbage(
        lambda: pickle.loads(pickle.dumps((items, batch), protocol=pickle.HIGHEST_PROTOCOL)))
    assert garbage == 0, f"{garbage} objects of cyclic garbage from one round trip"
    assert type(back_batch) is Experience and all(type(it) is BufferItem for it in back_items)
    for before, after in [(batch, back_batch), *zip(items, back_items)]:
        for key in ("sequences", "action_log_probs", "values", "reward", "advantages", "attention_mask"):
            a, b = getattr(before, key), getattr(after, key)
            assert a.dtype == b.dtype and torch.equal(a, b), key
        assert after.action_mask is None
