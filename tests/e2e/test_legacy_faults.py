"""Legacy roles (`ExperienceMakerHolder`, `DetachedPPOTrainer`) as Ray actors, given a fault or a bad input: each ends
within 30 s of it with an error that names what went wrong, and nothing else hangs."""
from __future__ import annotations

import sys
import time
from functools import partial

import pytest
import torch

from coati_compat.legacy.model_families import LlamaActor, LlamaCritic, LlamaRM
from coati_compat.legacy.strategies import NaiveStrategy
from coati_compat.shims.maker_holder import ExperienceMakerHolder
from coati_compat.shims.ppo_trainer import DetachedPPOTrainer
from coati_relay.toy import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timed, pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

WITHIN_S = 30.0
PROMPT = 4


def trainer_models():
    torch.manual_seed(0)
    cfg = tiny_config("llama")
    return LlamaActor(config=cfg), LlamaCritic(config=cfg, use_action_mask=True)


def maker_models():
    torch.manual_seed(0)
    cfg = tiny_config("llama")
    return (LlamaActor(config=cfg), LlamaCritic(config=cfg, use_action_mask=True), LlamaRM(config=cfg),
            LlamaActor(config=cfg))


def prompts(n: int):
    return [torch.randint(2, 300, (2, PROMPT)) for _ in range(n)]


def not_a_strategy():
    return "naive"


class ConstructorHost:
    """A Ray actor that builds a legacy role's implementation class in itself (as the role's own actor would)."""

    def __init__(self) -> None:
        from coati_compat.shims.maker_holder import ExperienceMakerHolderImpl
        from coati_compat.shims.ppo_trainer import DetachedPPOTrainerImpl

        self.classes = {"maker": ExperienceMakerHolderImpl, "trainer": DetachedPPOTrainerImpl}

    def construct(self, role, kwargs) -> None:
        self.classes[role](**kwargs)


class Roles:
    """Legacy actors named in the test namespace (with $RAY_NAMESPACE set in them), killed afterwards."""

    def __init__(self, ray) -> None:
        self.ray, self.made, self.host = ray, [], None
        self.env = {"runtime_env": {"env_vars": {"RAY_NAMESPACE": ray.get_runtime_context().namespace}}}

    def _make(self, cls, name, kwargs):
        actor = cls.options(name=name, num_gpus=1, max_concurrency=2, **self.env).remote(**kwargs)
        self.made.append(actor)
        return actor

    @staticmethod
    def maker_kwargs(trainers, **kwargs):
        return {"detached_trainer_name_list": trainers, "strategy_fn": NaiveStrategy, "model_fn": maker_models,
                "max_length": PROMPT + 4, "pad_token_id": 0, "eos_token_id": 1, "sampler": "transformers", **kwargs}

    @staticmethod
    def trainer_kwargs(makers, **kwargs):
        return {"experience_maker_holder_name_list": makers, "strategy_fn": NaiveStrategy,
                "model_fn": trainer_models, "train_batch_size": 2, **kwargs}

    def maker(self, name, trainers, **kwargs):
        return self._make(ExperienceMakerHolder, name, self.maker_kwargs(trainers, **kwargs))

    def trainer(self, name, makers, **kwargs):
        return self._make(DetachedPPOTrainer, name, self.trainer_kwargs(makers, **kwargs))

    def ready(self, actor):
        """``actor`` once its constructor has run (not timed)."""
        self.ray.get(actor.__ray_ready__.remote(), timeout=300)
        return actor

    def construct(self, role, kwargs):
        """The call that builds ``role``'s class with ``kwargs`` in a started actor."""
        if self.host is None:
            self.host = self.ray.remote(num_cpus=0)(ConstructorHost).options(**self.env).remote()
            self.made.append(self.ready(self.host))
        return partial(self.host.construct.remote, role, kwargs)


@pytest.fixture
def legacy(ray_cluster):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    roles = Roles(ray_cluster)
    yield roles
    for actor in roles.made:
        ray_cluster.kill(actor)
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def error_within(ray, call):
    """The error ``call()`` (returning an object ref) ends with, and the seconds it took."""
    t0 = time.monotonic()
    with pytest.raises(Exception) as caught:
        ray.get(call(), timeout=120)
    return str(caught.value), time.monotonic() - t0


def test_push_with_a_dead_maker_closes_it_on_the_live_ones_and_names_the_dead(ray_cluster, legacy):
    """A maker dies between two pushes: the second push names it within 30 s, and the live maker received the whole push
    (chunk_end included: it is not left with an open push that blocks its generation)."""
    ray = ray_cluster
    live, dead = legacy.maker("lf_live", ["lf_trainer"]), legacy.maker("lf_dead", ["lf_trainer"])
    trainer = legacy.trainer("lf_trainer", ["lf_live", "lf_dead"])
    ray.get(trainer.sync_models_to_remote_makers.remote(), timeout=120)  # the trainer holds both handles now
    ray.kill(dead)
    message, took = error_within(ray, trainer.sync_models_to_remote_makers.remote)
    print(f"push with a dead maker: {took:.1f}s: {message.splitlines()[-1][:300]}")
    assert "failed on experience maker(s) ['lf_dead']" in message and "died" in message, message
    assert took < WITHIN_S
    assert ray.get(live.get_weight_version.remote(), timeout=30) == 2  # the push was closed on the live maker
    ray.get(live.workingloop.remote(partial(prompts, 1), num_steps=1), timeout=30)  # and it generates again


def test_a_maker_waits_briefly_for_a_trainer_created_after_its_lookup(ray_cluster, legacy):
    """The named lookup waits a few seconds for the name to appear (a driver creates the roles one by one)."""
    ray = ray_cluster
    maker = legacy.ready(legacy.maker("lf_early_maker", ["lf_late_trainer"]))
    lookup = maker.update_target_trainer_list.remote()
    time.sleep(1.0)
    legacy.trainer("lf_late_trainer", ["lf_early_maker"])
    ray.get(lookup, timeout=60)


# Each bad input: what builds the call that meets it (given the fixture's roles), and the words its error must
# contain. Constructor inputs are given to the role's class inside a Ray actor started beforehand, so the time
# measured is the constructor's, not a worker's start (tens of seconds on a loaded 2-core host).
def _empty_trainer_list(roles):
    return roles.construct("maker", roles.maker_kwargs([]))


def _env_info_without_keys(roles):
    return roles.construct("maker", roles.maker_kwargs(["bi_t"], env_info={"rank": "0"}))


def _strategy_fn_returning_a_string(roles):
    return roles.construct("trainer", roles.trainer_kwargs(["bi_m"], strategy_fn=not_a_strategy))


def _train_batch_size_zero(roles):
    return roles.construct("trainer", roles.trainer_kwargs(["bi_m"], train_batch_size=0))


def _fit_without_update_steps(roles):
    return partial(roles.ready(roles.trainer("bi_fit", ["bi_m"])).fit.remote, 4, 0)


def _max_length_below_the_prompt(roles):
    roles.ready(roles.trainer("bi_len_t", ["bi_len_m"]))
    maker = roles.ready(roles.maker("bi_len_m", ["bi_len_t"], max_length=PROMPT))
    return partial(maker.workingloop.remote, partial(prompts, 1), num_steps=1)


def _maker_pushing_to_a_missing_trainer(roles):
    maker = roles.ready(roles.maker("bi_mt", ["no_such_trainer"]))
    return partial(maker.workingloop.remote, partial(prompts, 1), num_steps=1)


def _trainer_syncing_to_a_missing_maker(roles):
    return roles.ready(roles.trainer("bi_mm", ["no_such_maker"])).sync_models_to_remote_makers.remote


BAD_INPUTS = [
    (_empty_trainer_list, ["detached_trainer_name_list", "non-empty"]),
    (_env_info_without_keys, ["env_info lacks", "world_size"]),
    (_fit_without_update_steps, ["update_steps must be an int >= 1", "got 0"]),
    (_strategy_fn_returning_a_string, ["strategy_fn returned str", "not a strategy"]),
    (_train_batch_size_zero, ["train_batch_size must be an int >= 1", "got 0"]),
    (_max_length_below_the_prompt, [f"max_length={PROMPT}", f"prompts of {PROMPT} tokens"]),
    (_maker_pushing_to_a_missing_trainer, ["no live trainer named 'no_such_trainer'", ".options(name="]),
    (_trainer_syncing_to_a_missing_maker, ["no live experience maker named 'no_such_maker'", ".options(name="]),
]


@pytest.mark.parametrize("build,words", BAD_INPUTS, ids=[b.__name__.strip("_") for b, _ in BAD_INPUTS])
def test_bad_legacy_input_ends_within_30s_naming_it(ray_cluster, legacy, build, words):
    message, took = error_within(ray_cluster, build(legacy))
    print(f"{build.__name__.strip('_')}: {took:.1f}s: {message.splitlines()[-1][:300]}")
    for word in words:
        assert word in message, message
    assert "sample_batch_size" not in message and "num_actions" not in message, message
    assert took < WITHIN_S, f"{took:.1f}s: {message}"
