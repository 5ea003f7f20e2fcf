"""The legacy Ray roles as plain classes: replay buffer, trainer and maker implementations, the Ray-class facade."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

from coati_compat.legacy.experience import Experience
from coati_compat.legacy.lora import LoRAConstructor
from coati_compat.legacy.model_families import LlamaActor, LlamaCritic, LlamaRM
from coati_compat.legacy.strategies import NaiveStrategy
from coati_compat.reference import orchestration as ref_orch
from coati_compat.reference.lora import push_lora
from coati_compat.reference.replay_buffer import BufferEmpty, LegacyReplayBufferModel
from coati_compat.shims import remote
from coati_compat.shims.maker_holder import ExperienceMakerHolderImpl, load_pushed_state, route_round_robin
from coati_compat.shims.ppo_trainer import DetachedPPOTrainerImpl
from coati_compat.shims.replay_buffer import DetachedReplayBuffer, NoProducersError
from coati_relay.toy import tiny_config

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

SEQ, ACT = 6, 3


def make_batch(ids) -> Experience:
    """An Experience whose row k is tagged with ids[k] in every sequence token."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    b = ids.numel()
    return Experience(sequences=ids[:, None].repeat(1, SEQ), action_log_probs=torch.zeros(b, ACT),
                      values=ids.float(), reward=ids.float(), advantages=ids.float()[:, None],
                      attention_mask=torch.ones(b, SEQ, dtype=torch.long), action_mask=torch.ones(b, ACT).bool())


def ids_of(batch: Experience):
    return batch.sequences[:, 0].tolist()


def local_buffer(bs: int, limit: int = 0, **kw) -> DetachedReplayBuffer:
    return DetachedReplayBuffer(bs, limit, **kw)


# -- replay buffer ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bs,chunks", [(4, [3, 5, 2, 7, 1]), (3, [1, 1, 1, 9, 2]), (5, [12, 4])])
def test_buffer_batches_like_the_reference_model(bs, chunks):
    buf, ref = local_buffer(bs), LegacyReplayBufferModel(bs)
    next_id = 0
    for n in chunks:
        ids = list(range(next_id, next_id + n))
        next_id += n
        buf.append(make_batch(ids))
        ref.extend(ids)
        assert buf.get_length() == ref.get_length()
    while ref.get_length():
        assert ids_of(buf.sample()) == ref.sample()
    assert buf.get_length() == 0
    assert buf.counters()["pending_items"] == len(ref.collector)


def test_buffer_left_pads_action_fields_of_mixed_lengths():
    buf = local_buffer(2)
    short = make_batch([1])
    short.action_log_probs, short.action_mask = torch.ones(1, 2), torch.ones(1, 2).bool()
    buf.append(short)
    buf.append(make_batch([2]))
    batch = buf.sample()
    assert batch.action_mask.tolist()[0] == [False, True, True]
    assert batch.action_log_probs.shape == (2, ACT)


def test_leftover_items_are_counted_and_reported(caplog):
    buf = local_buffer(4)
    buf.append(make_batch(range(6)))
    assert buf.get_length() == 1
    with caplog.at_level("WARNING"):
        assert buf.report_leftover() == 2
    assert "2 items wait for a batch of 4" in caplog.text
    buf.clear()
    assert buf.counters()["dropped_items"] == 2


def test_limit_blocks_the_producer_until_a_batch_is_sampled():
    buf = local_buffer(2, limit=1)
    producer = threading.Thread(target=buf.append, args=(make_batch(range(4)),))
    producer.start()
    time.sleep(0.3)
    assert producer.is_alive() and buf.get_length() == 1  # second batch held back by limit=1
    assert ids_of(buf.sample()) == [0, 1]
    producer.join(timeout=5)
    assert not producer.is_alive()
    assert ids_of(buf.sample()) == [2, 3]


def test_limit_stops_throttling_once_no_fit_consumes():
    buf = local_buffer(2, limit=1)
    buf.set_throttle(False)
    buf.append(make_batch(range(6)))  # would block with throttling on
    assert buf.get_length() == 3


def test_limit_wait_times_out_with_a_clear_error():
    buf = local_buffer(1, limit=1, wait_timeout_s=0.2, poll_s=0.05)
    with pytest.raises(TimeoutError, match="limit=1"):
        buf.append(make_batch([0, 1]))


def test_clear_empties_the_buffer():
    buf = local_buffer(2)
    buf.append(make_batch(range(5)))
    buf.clear()  # the legacy clear() raised AttributeError
    assert buf.get_length() == 0 and buf.batch_collector == []
    buf.append(make_batch([7, 8]))
    assert ids_of(buf.sample()) == [7, 8]
    ref = LegacyReplayBufferModel(2)
    with pytest.raises(AttributeError):
        ref.clear()


def test_sample_times_out_instead_of_blocking_forever():
    buf = local_buffer(2, wait_timeout_s=0.3, poll_s=0.05)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no batch"):
        buf.sample()
    assert time.monotonic() - start < 2
    with pytest.raises(BufferEmpty):
        LegacyReplayBufferModel(2).sample()


def test_sample_raises_once_every_maker_has_finished():
    buf = local_buffer(2, poll_s=0.05, finished_grace_s=0.2)
    buf.register_producer("maker0")
    buf.append(make_batch([1]))
    buf.producer_finished("maker0")
    with pytest.raises(NoProducersError, match="1 items wait"):
        buf.sample()


@pytest.mark.slow
def test_sample_raises_when_every_maker_is_dead(ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Maker:
        def ping(self):
            return True

    makers = [Maker.remote() for _ in range(2)]
    ray.get([m.ping.remote() for m in makers], timeout=60)
    buf = DetachedReplayBuffer(2, poll_s=0.2, wait_timeout_s=60)
    for i, m in enumerate(makers):
        buf.register_producer(f"maker{i}", m)
    buf.append(make_batch([1, 2]))
    assert ids_of(buf.sample()) == [1, 2]
    for m in makers:
        ray.kill(m)
    start = time.monotonic()
    with pytest.raises(NoProducersError, match="dead"):
        buf.sample()
    assert time.monotonic() - start < 15


@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_buffer_rejects_bad_sizes(value):
    with pytest.raises(ValueError, match="sample_batch_size"):
        local_buffer(value)


# -- routing ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("calls,n", [([5, 3, 4], 2), ([1, 1, 1, 1], 3), ([7], 1), ([2, 6], 4)])
def test_round_robin_routing_matches_the_reference(calls, n):
    expected, _ = ref_orch.route_items(calls, n)
    start = 0
    for count, ref_targets in zip(calls, expected):
        groups, start = route_round_robin(count, start, n)
        targets = [None] * count
        for trainer, items in enumerate(groups):
            for k in items:
                targets[k] = trainer
        assert targets == ref_targets


# -- trainer implementation without Ray ---------------------------------------------------------------------------
CFG = tiny_config("llama")


def trainer_models():
    torch.manual_seed(0)
    return LlamaActor(config=CFG), LlamaCritic(config=CFG, use_action_mask=True)


class RecordingTrainer(DetachedPPOTrainerImpl):
    """The PPO implementation class, recording the actions of fit next to its callbacks."""

    def __init__(self, *args, **kwargs):
        self.events = []
        self.trained_ids = []
        super().__init__(*args, **kwargs)
        self.callbacks.append(Recorder(self.events))

    def _buffer_sample(self):
        self.events.append(("buffer_sample", None))
        return super()._buffer_sample()

    def training_step(self, experience):
        self.events.append(("training_step", self.callbacks[-1].epoch))
        self.trained_ids.append(experience.sequences[:, 0].tolist())
        return super().training_step(experience)

    def _update_remote_makers(self, fully_update=False, **config):
        self.events.append(("update_remote_makers", None))
        super()._update_remote_makers(fully_update, **config)


class Recorder:
    def __init__(self, events):
        self.events, self.epoch = events, None

    def __getattr__(self, hook):
        if not hook.startswith("on_"):
            raise AttributeError(hook)

        def record(*args):
            if hook in ("on_episode_start", "on_episode_end", "on_epoch_start", "on_epoch_end"):
                self.events.append((hook, args[0]))
                if hook == "on_epoch_start":
                    self.epoch = args[0]
            else:
                self.events.append((hook, None))
        return record


def tiny_rollout(ids, seed=0):
    """A real-shaped batch for the tiny llama: rows tagged by their first token."""
    g = torch.Generator().manual_seed(seed)
    b = len(ids)
    seq = torch.randint(2, 300, (b, 12), generator=g)
    seq[:, 0] = torch.as_tensor(ids)
    return Experience(seq, -torch.rand(b, 4, generator=g) * 3, torch.randn(b, generator=g),
                      torch.randn(b, generator=g), torch.randn(b, 1, generator=g),
                      torch.ones(b, 12, dtype=torch.long), torch.ones(b, 4).bool())


@pytest.mark.parametrize("total,update,epochs", [(4, 2, 2), (5, 2, 1), (3, 3, 3)])
def test_fit_follows_the_reference_order(total, update, epochs):
    trainer = RecordingTrainer([], NaiveStrategy, trainer_models, train_batch_size=2)
    trainer.detached_replay_buffer = local_buffer(2)
    consumed = (total // update) * update
    for k in range(consumed + 1):  # one batch more than the fit needs
        trainer.buffer_append(tiny_rollout([2 * k, 2 * k + 1], seed=k))
    trainer.fit(total, update, epochs)
    assert trainer.events == ref_orch.fit_events(total, update, epochs)
    assert trainer.detached_replay_buffer.counters()["sampled_batches"] == consumed
    assert trainer.buffer_get_length() == 1
    assert trainer.weight_version == total // update
    per_episode = update * epochs
    for e in range(total // update):  # later epochs replay exactly the episode's fresh batches
        steps = trainer.trained_ids[e * per_episode:(e + 1) * per_episode]
        for epoch in range(1, epochs):
            assert sorted(steps[epoch * update:(epoch + 1) * update]) == sorted(steps[:update])


def test_fit_rejects_bad_counts():
    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, trainer_models)
    with pytest.raises(ValueError, match="update_steps"):
        trainer.fit(4, 0)


def test_trainer_keeps_the_legacy_lr_unless_told():
    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, trainer_models)
    assert [g["lr"] for g in trainer.actor_optim.param_groups] == [1e-7]
    assert isinstance(trainer.critic_optim, torch.optim.Adam)
    fast = DetachedPPOTrainerImpl([], NaiveStrategy, trainer_models, actor_lr=1e-3, critic_lr=2e-3)
    assert fast.actor_optim.param_groups[0]["lr"] == 1e-3 and fast.critic_optim.param_groups[0]["lr"] == 2e-3
    with pytest.raises(ValueError, match="actor_lr"):
        DetachedPPOTrainerImpl([], NaiveStrategy, trainer_models, actor_lr=0)


def test_pushed_shards_are_hf_keys_fp16_and_trainable_only():
    def lora_models():
        torch.manual_seed(0)
        return LlamaActor(config=CFG, lora_rank=1), LlamaCritic(config=CFG, lora_rank=1, use_action_mask=True)

    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, lora_models, update_lora_weights=True)
    full = next(trainer._get_model_state_dict_shard(trainer.actor, fully_update=True))
    assert "model.embed_tokens.weight" in full and "lm_head.weight" in full  # HF keys, no "model." wrapper prefix
    assert all(v.dtype == torch.float16 for v in full.values() if v.is_floating_point())
    lora = next(trainer._get_model_state_dict_shard(trainer.actor, requires_grad_only=True))
    assert lora and all("lora_A" in k or "lora_B" in k for k in lora)
    configs = trainer._get_model_lora_config_dict(trainer.actor)
    assert set(configs) == {k.rsplit(".", 1)[0] for k in lora}


# -- maker implementation without Ray -----------------------------------------------------------------------------
def maker_models():
    torch.manual_seed(1)
    return (LlamaActor(config=CFG), LlamaCritic(config=CFG, use_action_mask=True), LlamaRM(config=CFG),
            LlamaActor(config=CFG))


def make_maker(**kw):
    return ExperienceMakerHolderImpl(["trainer0"], NaiveStrategy, maker_models, max_length=14, pad_token_id=0,
                                     eos_token_id=1, **kw)


def test_maker_makes_legacy_experience():
    maker = make_maker(kl_coef=0.05)
    assert maker.experience_maker.kl_coef == 0.05
    prompts = torch.randint(2, 300, (3, 6))
    torch.manual_seed(0)
    from_dict = maker._make_experience({"input_ids": prompts, "attention_mask": torch.ones_like(prompts)})
    assert from_dict.sequences.shape == (3, 14) and from_dict.action_mask.shape == (3, 8)
    torch.testing.assert_close(from_dict.advantages, (from_dict.reward - from_dict.values)[:, None])
    assert maker._make_experience(prompts).sequences.shape == (3, 14)
    with pytest.raises(ValueError, match="Tensor of input ids or a dict"):
        maker._make_experience([1, 2, 3])


def test_maker_needs_trainers():
    with pytest.raises(ValueError, match="non-empty"):
        ExperienceMakerHolderImpl([], NaiveStrategy, maker_models)


def test_weight_push_protocol_loads_hf_and_critic_keys():
    maker = make_maker(sync_models_from_trainers=True)
    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, trainer_models)
    actor_sd = next(trainer._get_model_state_dict_shard(trainer.actor, fully_update=True))
    critic_sd = next(trainer._get_model_state_dict_shard(trainer.critic, fully_update=True))
    assert not maker._is_fully_initialized
    maker.update_experience_maker(chunk_start=True, fully_update=True)
    assert maker._open_pushes == 1
    maker.update_experience_maker(new_actor_state_dict=actor_sd, new_critic_state_dict=critic_sd, fully_update=True)
    maker.update_experience_maker(chunk_end=True, fully_update=True)
    assert maker._is_fully_initialized and maker._open_pushes == 0
    assert maker.get_weight_version() == 1
    got = maker.experience_maker.actor.model.state_dict()["model.layers.0.mlp.up_proj.weight"]
    torch.testing.assert_close(got, actor_sd["model.layers.0.mlp.up_proj.weight"].float())
    got = maker.experience_maker.critic.state_dict()["value_head.weight"]
    torch.testing.assert_close(got, critic_sd["value_head.weight"].float())
    with pytest.raises(RuntimeError, match="without a chunk_start"):
        maker.update_experience_maker(chunk_end=True)


def test_overlapping_pushes_of_two_trainers_complete_and_hold_back_generation():
    """Two trainers pushing to one maker at once (1 maker, 2 trainers): the legacy lock held from chunk_start to
    chunk_end made the second chunk_start wait forever in the single model_io thread."""
    maker = make_maker(wait_timeout_s=1.0)
    shard = {"value_head.bias": torch.zeros(1)}
    maker.update_experience_maker(chunk_start=True)
    maker.update_experience_maker(chunk_start=True)
    maker.update_experience_maker(new_critic_state_dict=shard)
    maker.update_experience_maker(new_critic_state_dict=shard)
    maker.update_experience_maker(chunk_end=True)
    with pytest.raises(TimeoutError, match="weight push stayed open"):
        maker._inference_step(torch.randint(2, 300, (2, 6)))  # one push is still open
    maker.update_experience_maker(chunk_end=True)
    assert maker.get_weight_version() == 2 and maker._open_pushes == 0
    with maker._model_visit_lock:
        with pytest.raises(TimeoutError, match="models stayed locked"):
            maker.update_experience_maker(chunk_start=True)  # waits for the generation in flight
    assert maker._open_pushes == 0


def test_pushed_keys_that_name_nothing_raise():
    module = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="none of the 1 pushed actor keys"):
        load_pushed_state(module, {"model.weight": torch.zeros(2, 2)}, "actor")


def test_lora_push_replaces_the_previous_delta():
    maker = make_maker(update_lora_weights=True)
    actor_hf = maker.experience_maker.actor.model
    name = "model.layers.0.self_attn.q_proj"
    w0 = actor_hf.state_dict()[name + ".weight"].clone()
    a, b = torch.randn(1, 128), torch.randn(128, 1) * 0.1
    sd = {name + ".lora_A": a, name + ".lora_B": b}
    configs = {name: LoRAConstructor.extract_lora_config(LlamaActor(config=CFG, lora_rank=1).model)[name]}
    for _ in range(2):  # the same adapters pushed twice
        maker.update_experience_maker(chunk_start=True)
        maker.update_experience_maker(new_actor_state_dict=sd, new_actor_lora_config_dict=configs)
        maker.update_experience_maker(chunk_end=True)
    torch.testing.assert_close(actor_hf.state_dict()[name + ".weight"], w0 + b @ a)
    legacy = {name + ".weight": w0}
    for _ in range(2):
        legacy = push_lora(legacy, sd, {name: (1, 1, False)})
    torch.testing.assert_close(legacy[name + ".weight"], w0 + 2 * (b @ a))  # what the legacy code did


TRAINER_METHODS = ["fit", "sync_models_to_remote_makers", "buffer_get_length", "buffer_append", "buffer_extend",
                   "_buffer_sample", "_update_remote_makers", "training_step", "update_target_holder_list",
                   "strategy_save_actor", "strategy_save_critic", "strategy_save_actor_optim",
                   "strategy_save_critic_optim"]
MAKER_METHODS = ["workingloop", "update_experience_maker", "update_target_trainer_list", "_get_ready",
                 "_fully_initialized", "_inference_step", "_send_items", "_make_experience"]


def test_actor_classes_expose_every_legacy_remote_method():
    import ray

    from coati_compat.shims.maker_holder import ExperienceMakerHolder
    from coati_compat.shims.ppo_trainer import DetachedPPOTrainer

    for actor_cls, methods in ((DetachedPPOTrainer, TRAINER_METHODS), (ExperienceMakerHolder, MAKER_METHODS)):
        assert isinstance(actor_cls, ray.actor.ActorClass)
        exposed = actor_cls.__ray_metadata__.method_meta.methods
        assert not [m for m in methods if m not in exposed]


def test_strategy_save_writes_checkpoints(tmp_path):
    trainer = DetachedPPOTrainerImpl([], NaiveStrategy, trainer_models)
    trainer.strategy_save_actor(str(tmp_path / "actor.pt"), only_rank0=True)
    trainer.strategy_save_critic_optim(str(tmp_path / "critic_optim.pt"))
    saved = torch.load(tmp_path / "actor.pt", weights_only=True)
    assert saved.keys() == trainer.actor.state_dict().keys()
    assert "param_groups" in torch.load(tmp_path / "critic_optim.pt", weights_only=True)


# -- Ray-class facade ---------------------------------------------------------------------------------------------
def test_num_gpus_is_translated_on_a_cluster_without_gpus(monkeypatch):
    monkeypatch.setattr(remote, "_WARNED_TRANSLATIONS", set())
    with pytest.warns(UserWarning, match="num_gpus=1 of maker0 is translated"):
        out = remote.translate_actor_options({"name": "m", "num_gpus": 1, "max_concurrency": 2}, 2, 0, "maker0")
    assert out == {"name": "m", "num_cpus": 0, "max_concurrency": 2}
    assert remote.translate_actor_options({"num_gpus": 1}, 2, 4) == {"num_gpus": 1}
    with pytest.warns(UserWarning, match="lowered to 2"):
        assert remote.translate_actor_options({"num_cpus": 8}, 2, 0)["num_cpus"] == 2


def test_options_warn_at_the_callers_line():
    from coati_compat.shims.ppo_trainer import DetachedPPOTrainer

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DetachedPPOTrainer.options(name="trainer0", max_concurrency=2)
    future = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert future and "DetachedPPOTrainer is deprecated" in str(future[0].message)
    assert future[0].filename == __file__


def test_user_subclass_decorated_by_ray_gets_translated_options(monkeypatch):
    import ray

    from coati_compat.shims.trainer_base import TRAINER_CONCURRENCY_GROUPS, DetachedTrainer

    seen = []
    monkeypatch.setattr(remote, "translate_actor_options", lambda o, c, g, who="": seen.append(dict(o)) or {})

    @ray.remote(concurrency_groups=TRAINER_CONCURRENCY_GROUPS)
    class MyTrainer(DetachedTrainer):
        def training_step(self, experience):
            return {}

        def _update_remote_makers(self, fully_update=False, **kw):
            pass

    MyTrainer.options(name="t", num_gpus=1)
    assert seen == [{"name": "t", "num_gpus": 1}]


def test_namespace_error_names_the_variable(monkeypatch):
    monkeypatch.delenv("RAY_NAMESPACE", raising=False)
    with pytest.raises(RuntimeError, match="RAY_NAMESPACE is not set"):
        remote.legacy_namespace()


@pytest.mark.parametrize("keep_half", ["", "1"])
def test_device_redirect_keeps_cuda_calls_on_the_cpu(keep_half):
    dtype = "torch.float16" if keep_half else "torch.float32"
    code = ("import torch, warnings\n"
            "from coati_compat.cpu_mode import redirect as d\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    assert d.install()\n"
            "    t = torch.ones(2).cuda(); m = torch.nn.Linear(2, 2).half().cuda()\n"
            "    b = torch.nn.Linear(2, 2).bfloat16(); h = torch.ones(2).half()\n"
            "    x = torch.randint(5, (3,), device=torch.cuda.current_device()); torch.cuda.set_device(0)\n"
            "assert t.device.type == x.device.type == 'cpu' and h.dtype == torch.float16\n"
            f"assert m.weight.dtype == {dtype}, m.weight.dtype\n"
            "assert b.weight.dtype == (torch.bfloat16 if m.weight.dtype == torch.float16 else torch.float32)\n"
            "print(sum('redirected to the CPU' in str(i.message) for i in w),"
            " sum('keep fp32' in str(i.message) for i in w))\n")
    env = dict(os.environ, COATI_RELAY_KEEP_HALF_ON_CPU=keep_half)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0" if keep_half else "1"]  # one warning per redirect, for all the calls
