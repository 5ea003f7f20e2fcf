"""Pair 4, buffer hand-off: experience made in a maker process reaches the trainer in training batches.

- old: the legacy ``DetachedReplayBuffer`` path. The maker sends its items to the trainer (``buffer_extend``'s
  argument), the trainer re-batches them to ``sample_batch_size`` (``LegacyReplayBufferModel`` and
  ``merge_items`` from the reference) and puts every batch, payload and all, into a ``ray.util.queue.Queue`` actor;
  ``sample`` gets it back out. The bytes travel maker -> trainer -> queue actor -> trainer.
- new: the engine's ``RolloutQueue``. The maker queues each rollout with its version (``pack_payload``: the short
  ones' pickled bytes by value, through the queue actor; the long ones ``ray.put``, their reference queued); the
  trainer takes ``SAMPLE_BATCH / MAKER_BATCH`` entries per batch, unpacks them (``unpack_payloads``: from the object
  store for references) and joins them (``Rollout.concat``).
- shim: the legacy API as this project serves it, ``coati_compat``'s ``DetachedReplayBuffer``. The maker's items
  reach the trainer (as ``buffer_extend``'s argument does), the buffer re-batches them and ``sample`` returns the
  oldest batch; every batch the buffer holds stays in the trainer's process.

The maker is a Ray actor holding ``NUM_ITEMS`` samples made up front (as legacy items and as rollouts of the same
tensors); the benchmark process is the trainer. Both sides deliver the same tokens and log-probs in the same order,
in ``NUM_ITEMS / SAMPLE_BATCH`` batches, for short and long sequences.
"""
from __future__ import annotations

import pytest
import ray
import torch

from coati_compat.reference.experience import merge_items
from coati_compat.reference.replay_buffer import LegacyReplayBufferModel
from coati_relay.exchange.queue import pack_payload, unpack_payloads
from coati_relay.rollout import Rollout

NUM_ITEMS, MAKER_BATCH, SAMPLE_BATCH, SEED, TIMEOUT_S = 128, 8, 16, 0, 60.0
ROUNDS, WARMUP = 8, 1
SIZES = {"64 tokens": (16, 48), "2048 tokens": (512, 1536)}  # (prompt, response) tokens per sample
NUM_BATCHES = NUM_ITEMS // SAMPLE_BATCH


def _maker_class():
    """The maker actor class (defined here so that Ray ships it by value to its worker)."""

    class Maker:
        def __init__(self, prompt_len: int, response_len: int, seed: int):
            from coati_compat.reference.experience import split_batch

            self._split = split_batch
            g = torch.Generator().manual_seed(seed)
            n, s = NUM_ITEMS, prompt_len + response_len
            seq = torch.randint(6, 320, (n, s), generator=g)
            logp = -5 * torch.rand(n, response_len, generator=g)
            values, reward = torch.randn(n, generator=g), torch.randn(n, generator=g)
            self.batches, self.rollouts = [], []
            for start in range(0, n, MAKER_BATCH):
                rows = slice(start, start + MAKER_BATCH)
                self.batches.append({
                    "sequences": seq[rows], "action_log_probs": logp[rows], "values": values[rows],
                    "reward": reward[rows], "advantages": (reward[rows] - values[rows])[:, None],
                    "attention_mask": torch.ones(MAKER_BATCH, s, dtype=torch.long),
                    "action_mask": torch.ones(MAKER_BATCH, response_len, dtype=torch.bool)})
                self.rollouts.append(Rollout(
                    prompt_ids=seq[rows, :prompt_len], response_ids=seq[rows, prompt_len:],
                    prompt_mask=torch.ones(MAKER_BATCH, prompt_len, dtype=torch.long),
                    response_mask=torch.ones(MAKER_BATCH, response_len, dtype=torch.bool), logprobs=logp[rows],
                    response_lengths=torch.full((MAKER_BATCH,), response_len), rewards=reward[rows]))

        def num_batches(self) -> int:
            return len(self.batches)

        def legacy_items(self, index: int):
            """The items of maker batch ``index`` (what the legacy maker passed to ``buffer_extend``)."""
            return self._split(self.batches[index])

        def shim_items(self, index: int):
            """The items of maker batch ``index`` as the shim's maker passes them to ``buffer_extend``."""
            from coati_compat.legacy.experience import Experience, split_experience_batch

            return split_experience_batch(Experience(**self.batches[index]))

        def engine_put(self, queue) -> int:
            """Queues every rollout as a producer does (`pack_payload`: small ones by value, others by reference)."""
            for task, rollout in enumerate(self.rollouts):
                ray.get(queue.put.remote(pack_payload(rollout, rollout.nbytes), 0, rollout.num_prompts, "maker", task,
                                         TIMEOUT_S), timeout=TIMEOUT_S + 10)
            return len(self.rollouts)

    return ray.remote(num_cpus=1)(Maker)


@pytest.fixture(scope="module", params=list(SIZES))
def maker(request, ray_session):
    """(size name, maker actor) for each sequence size."""
    prompt_len, response_len = SIZES[request.param]
    actor = _maker_class().remote(prompt_len, response_len, SEED)
    assert ray.get(actor.num_batches.remote(), timeout=TIMEOUT_S) == NUM_ITEMS // MAKER_BATCH
    yield request.param, actor
    ray.kill(actor)


def _group(size: str) -> str:
    return f"buffer hand-off ({NUM_ITEMS} samples of {size}, batches of {SAMPLE_BATCH})"


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _legacy_round(maker_actor, queue):
    buffer = LegacyReplayBufferModel(SAMPLE_BATCH)
    for index in range(NUM_ITEMS // MAKER_BATCH):
        buffer.extend(ray.get(maker_actor.legacy_items.remote(index), timeout=TIMEOUT_S))
        while buffer.get_length():
            queue.put(merge_items(buffer.sample()), timeout=TIMEOUT_S)
    return [queue.get(timeout=TIMEOUT_S) for _ in range(NUM_BATCHES)]


def _engine_round(maker_actor, queue):
    ray.get(maker_actor.engine_put.remote(queue), timeout=TIMEOUT_S * NUM_BATCHES)
    batches = []
    for _ in range(NUM_BATCHES):
        entries = ray.get(queue.get.remote(SAMPLE_BATCH // MAKER_BATCH, TIMEOUT_S), timeout=TIMEOUT_S + 10)
        rollouts = unpack_payloads([e.payload for e in entries], TIMEOUT_S)
        batches.append(Rollout.concat(rollouts, pad_token_id=0))
    return batches


def _shim_round(maker_actor, buffer):
    batches = []
    for index in range(NUM_ITEMS // MAKER_BATCH):
        buffer.extend(ray.get(maker_actor.shim_items.remote(index), timeout=TIMEOUT_S))
        while buffer.get_length():
            batches.append(buffer.sample())
    return batches


@pytest.fixture(scope="module")
def expected(maker):
    """The maker's samples as the trainer must receive them: (sequences [N, S], log-probs [N, R])."""
    _, actor = maker
    items = [item for i in range(NUM_ITEMS // MAKER_BATCH)
             for item in ray.get(actor.legacy_items.remote(i), timeout=TIMEOUT_S)]
    return torch.stack([it["sequences"] for it in items]), torch.stack([it["action_log_probs"] for it in items])


def test_legacy_queue(benchmark, work, maker, expected):
    from ray.util.queue import Queue

    size, actor = maker
    queue = Queue(maxsize=0, actor_options={"num_cpus": 1})
    benchmark.group = _group(size)
    batches = benchmark.pedantic(_legacy_round, args=(actor, queue), rounds=ROUNDS, warmup_rounds=WARMUP)
    work["items"] = NUM_ITEMS
    work["bytes"] = sum(_nbytes(b.values()) for b in batches)
    assert queue.empty()
    queue.shutdown()
    assert len(batches) == NUM_BATCHES and all(b["sequences"].size(0) == SAMPLE_BATCH for b in batches)
    assert torch.equal(torch.cat([b["sequences"] for b in batches]), expected[0])
    assert torch.equal(torch.cat([b["action_log_probs"] for b in batches]), expected[1])


def test_engine_rollout_queue(benchmark, work, maker, expected):
    from coati_relay.exchange.queue import make_rollout_queue

    size, actor = maker
    queue = make_rollout_queue(maxsize=0, staleness=None)
    benchmark.group = _group(size)
    batches = benchmark.pedantic(_engine_round, args=(actor, queue), rounds=ROUNDS, warmup_rounds=WARMUP)
    work["items"] = NUM_ITEMS
    work["bytes"] = sum(_nbytes(vars(b).values()) for b in batches)
    counters = ray.get(queue.counters.remote(), timeout=TIMEOUT_S)
    ray.kill(queue)
    assert counters["in_flight"] == 0 and counters["consumed"] == counters["produced"]
    assert len(batches) == NUM_BATCHES and all(b.num_sequences == SAMPLE_BATCH for b in batches)
    assert torch.equal(torch.cat([b.sequences for b in batches]), expected[0])
    assert torch.equal(torch.cat([b.logprobs for b in batches]), expected[1])


def test_shim_buffer(benchmark, work, maker, expected):
    from coati_compat.shims.replay_buffer import DetachedReplayBuffer

    size, actor = maker
    buffer = DetachedReplayBuffer(SAMPLE_BATCH, wait_timeout_s=TIMEOUT_S)
    benchmark.group = _group(size)
    batches = benchmark.pedantic(_shim_round, args=(actor, buffer), rounds=ROUNDS, warmup_rounds=WARMUP)
    work["items"] = NUM_ITEMS
    work["bytes"] = sum(_nbytes(vars(b).values()) for b in batches)
    counters = buffer.counters()
    assert counters["in_flight"] == 0 and counters["pending_items"] == 0
    assert counters["consumed"] == counters["produced"] == counters["sampled_batches"]
    assert len(batches) == NUM_BATCHES and all(b.sequences.size(0) == SAMPLE_BATCH for b in batches)
    assert torch.equal(torch.cat([b.sequences for b in batches]), expected[0])
    assert torch.equal(torch.cat([b.action_log_probs for b in batches]), expected[1])
