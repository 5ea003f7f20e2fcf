"""Level 3: the legacy orchestration, run through the shims' Ray actor classes and compared with the reference's
pure functions: batches consumed per fit, callback order of trainers and makers, weight-push cadence, versions and
calls, and the round-robin routing of items to trainers.
"""
from __future__ import annotations

import json
import sys
from functools import partial

import pytest
import torch

from coati_compat.legacy.callbacks import MakerCallback, TrainerCallback
from coati_compat.legacy.model_families import LlamaActor, LlamaCritic, LlamaRM
from coati_compat.legacy.strategies import NaiveStrategy
from coati_compat.reference import orchestration as ref
from coati_compat.reference.replay_buffer import LegacyReplayBufferModel
from coati_compat.shims.maker_holder import ExperienceMakerHolder
from coati_compat.shims.ppo_trainer import DetachedPPOTrainer, DetachedPPOTrainerImpl
from coati_compat.shims.replay_buffer import DetachedReplayBuffer
from coati_relay.toy import tiny_config

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]

TIMEOUT = 300
PROMPT, MAX_LEN, ITEMS_PER_STEP, STEPS, BATCH = 4, 8, 3, 4, 2


class EventFile:
    """Appends ``[hook, argument, batch ids]`` lines to a file (the callbacks run inside the actors)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, hook, arg=None, ids=None) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps([hook, arg, ids]) + "\n")


class TrainerEvents(TrainerCallback):
    def __init__(self, path: str) -> None:
        self.file = EventFile(path)

    def __getattribute__(self, name):
        if name.startswith("on_"):
            def hook(*args):
                arg = args[0] if args and isinstance(args[0], int) else None
                ids = args[1].sequences[:, 0].tolist() if name == "on_batch_end" else None
                self.file.write(name, arg, ids)
            return hook
        return object.__getattribute__(self, name)


class MakerEvents(MakerCallback):
    def __init__(self, path: str) -> None:
        self.file = EventFile(path)

    def __getattribute__(self, name):
        if name.startswith("on_"):
            return lambda *args: self.file.write(name)
        return object.__getattribute__(self, name)


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def trainer_models():
    torch.manual_seed(0)
    cfg = tiny_config("llama")
    return LlamaActor(config=cfg), LlamaCritic(config=cfg, use_action_mask=True)


def maker_models():
    torch.manual_seed(0)
    cfg = tiny_config("llama")
    return (LlamaActor(config=cfg), LlamaCritic(config=cfg, use_action_mask=True), LlamaRM(config=cfg),
            LlamaActor(config=cfg))


def tagged_prompts(n: int):
    """Prompt k is the token k + 2 repeated, so every sequence names the item it came from."""
    return [{"input_ids": torch.full((ITEMS_PER_STEP, PROMPT), 2 + ITEMS_PER_STEP * s).add_(torch.arange(
        ITEMS_PER_STEP)[:, None]), "attention_mask": torch.ones(ITEMS_PER_STEP, PROMPT, dtype=torch.long)}
        for s in range(n)]


@pytest.fixture
def by_value():
    """Lets the actors unpickle this module's callbacks and functions (the test dir is not on their path)."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.mark.slow
def test_one_maker_two_trainers_follow_the_reference(ray_cluster, tmp_path, by_value):
    ray = ray_cluster
    namespace = ray.get_runtime_context().namespace
    env = {"runtime_env": {"env_vars": {"RAY_NAMESPACE": namespace}}}
    num_trainers, update_steps, train_epochs = 2, 1, 2
    maker = ExperienceMakerHolder.options(name="orch_maker0", num_gpus=1, max_concurrency=2, **env).remote(
        detached_trainer_name_list=[f"orch_trainer{i}" for i in range(num_trainers)],
        strategy_fn=NaiveStrategy, model_fn=maker_models, sync_models_from_trainers=True,
        callbacks=[MakerEvents(str(tmp_path / "maker.jsonl"))], max_length=MAX_LEN, pad_token_id=0, eos_token_id=1)
    trainers = [DetachedPPOTrainer.options(name=f"orch_trainer{i}", num_gpus=1, max_concurrency=2, **env).remote(
        experience_maker_holder_name_list=["orch_maker0"] if i == 0 else [], strategy_fn=NaiveStrategy,
        model_fn=trainer_models, train_batch_size=BATCH, buffer_limit=2,
        callbacks=[TrainerEvents(str(tmp_path / f"trainer{i}.jsonl"))]) for i in range(num_trainers)]

    ray.get([t.sync_models_to_remote_makers.remote() for t in trainers], timeout=TIMEOUT)
    total_steps = ITEMS_PER_STEP * STEPS // (num_trainers * BATCH)
    loop = maker.workingloop.remote(partial(tagged_prompts, STEPS), num_steps=STEPS)
    fits = [t.fit.remote(total_steps, update_steps, train_epochs) for t in trainers]
    ray.get([loop] + fits, timeout=TIMEOUT)

    # routing: per-item round robin over the maker's trainers, the index persisting across batches
    routes, _ = ref.route_items([ITEMS_PER_STEP] * STEPS, num_trainers)
    flat_routes = [t for step in routes for t in step]
    consumed = (total_steps // update_steps) * update_steps
    for i, trainer in enumerate(trainers):
        events = read(tmp_path / f"trainer{i}.jsonl")
        expected = [[h, a] for h, a in ref.fit_events(total_steps, update_steps, train_epochs) if h.startswith("on_")]
        assert [[h, a] for h, a, _ in events] == expected
        fresh = []  # the batches of epoch 0, in the order they were sampled
        epoch = None
        for hook, arg, ids in events:
            epoch = arg if hook == "on_epoch_start" else epoch
            if hook == "on_batch_end" and epoch == 0:
                fresh += ids
        received = [2 + k for k, t in enumerate(flat_routes) if t == i]
        model = LegacyReplayBufferModel(BATCH)
        model.extend(received)
        assert fresh == [x for _ in range(consumed) for x in model.sample()]
        counters = ray.get(trainer.buffer_counters.remote(), timeout=TIMEOUT)
        assert counters["consumed"] == consumed
        assert counters["produced_samples"] + counters["pending_items"] == len(received)
        assert ray.get(trainer.get_weight_version.remote(), timeout=TIMEOUT) == 1 + total_steps // update_steps

    # weight pushes: the initial full sync, then one push per episode of the one trainer that serves the maker
    assert ray.get(maker.get_weight_version.remote(), timeout=TIMEOUT) == 1 + total_steps // update_steps
    maker_events = [h for h, _, _ in read(tmp_path / "maker.jsonl")]
    assert maker_events == [h for h, _ in ref.workingloop_events(ref.workingloop_batches(STEPS, num_steps=STEPS))
                            if h.startswith("on_")]
    for actor in trainers + [maker]:
        ray.kill(actor)


@pytest.mark.slow
def test_weight_push_calls_follow_the_reference(ray_cluster):
    """The update_experience_maker calls one holder receives per push, full (sharded) and after training."""
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class RecordingHolder:
        def __init__(self):
            self.calls = []

        def update_experience_maker(self, **kw):
            self.calls.append({k: (v if isinstance(v, bool) else len(v)) for k, v in kw.items()
                               if v is not None and not k.endswith("lora_config_dict")})

        def get_calls(self):
            return self.calls

    holders = [RecordingHolder.remote() for _ in range(2)]
    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, trainer_models)
    trainer.target_holder_list, trainer._is_target_holder_initialized = holders, True
    shard_size = 400_000  # bytes: the fp32 tiny actor (~0.5 MB) goes out in several shards
    n_actor = len(list(trainer.strategy.get_model_state_dict_shard(trainer.actor, shard_size=shard_size)))
    n_critic = len(list(trainer.strategy.get_model_state_dict_shard(trainer.critic, shard_size=shard_size)))
    assert n_actor > 1
    trainer.sync_models_to_remote_makers(shard_size=shard_size)
    trainer._update_remote_makers()
    expected = ref.weight_push_calls(True, n_actor, n_critic) + ref.weight_push_calls(False, 1, 1)
    for holder in holders:
        calls = ray.get(holder.get_calls.remote(), timeout=TIMEOUT)
        assert [{k: (v if isinstance(v, bool) else "payload") for k, v in c.items()} for c in calls] == [
            {k: (v if isinstance(v, bool) else "payload") for k, v in c.items()} for c in expected]
    assert trainer.weight_version == 2


def test_buffer_length_and_blocking_follow_the_reference_model():
    """Interleaved extends and samples under a limit: queued batches, sampled batches and whether a producer is
    held back match the reference model after every operation."""
    import threading
    import time

    from coati_compat.legacy.experience import Experience

    def batch(ids):
        ids = torch.as_tensor(ids)
        n = len(ids)
        return Experience(ids[:, None].repeat(1, 4), torch.zeros(n, 2), ids.float(), ids.float(),
                          ids.float()[:, None], torch.ones(n, 4, dtype=torch.long), torch.ones(n, 2).bool())

    buf, model = DetachedReplayBuffer(2, limit=2), LegacyReplayBufferModel(2, limit=2)
    producers, next_id = [], 0
    for op in ["extend 3", "extend 4", "sample", "extend 1", "sample", "sample", "extend 5", "sample", "sample"]:
        if op == "sample":
            assert buf.sample().sequences[:, 0].tolist() == model.sample()
        else:
            ids = list(range(next_id, next_id + int(op.split()[1])))
            next_id += len(ids)
            producers.append(threading.Thread(target=buf.append, args=(batch(ids),)))
            producers[-1].start()
            model.extend(ids)
        time.sleep(0.2)
        assert buf.get_length() == model.get_length(), op
        assert any(p.is_alive() for p in producers) == model.producer_blocked, op
    for p in producers:
        p.join(timeout=5)
    assert buf.counters()["pending_items"] == len(model.collector)
