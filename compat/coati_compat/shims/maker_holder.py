"""Legacy ``coati.ray.experience_maker_holder.ExperienceMakerHolder``: the experience maker role.

`ExperienceMakerHolderImpl` holds the four legacy models and makes experience with the legacy ``NaiveExperienceMaker``
(KL-shaped reward, ``advantage = reward - value``), sampling on the engine's inference backends
(`coati_compat.shims.maker_sampler`; the maker's weight version is its backend's). It sends each item to its trainers
round robin (the index persisting across batches) and loads the weights pushed through the chunked
``update_experience_maker`` protocol. `ExperienceMakerHolder` is its Ray actor class.

Deviations (migration_guide/deviations.md): the maker waits until its trainers have taken its items; ``kl_coef``
reaches the experience maker; pushed keys that name no weight raise; LoRA pushes replace the previous delta; waits for
the initial sync notice dead trainers and time out.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
import tracemalloc
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import ray
import torch

from coati_compat.legacy.callbacks import ExperienceMakerPerformanceEvaluator, MakerCallback
from coati_compat.legacy.experience import Experience, split_experience_batch
from coati_compat.legacy.experience_maker import NaiveExperienceMaker
from coati_compat.legacy.generation import default_generate_kwargs
from coati_compat.legacy.lora import LoRAConstructor
from coati_compat.legacy.ray_utils import get_model_numel, set_dist_env
from coati_compat.observers import maker_observers
from coati_compat.shims.maker_sampler import EngineSampler, default_sampler, resolve_sampler
from coati_compat.shims.remote import (
    LegacyActorBase,
    build_strategy,
    enable_debug_logging,
    get_named_actor,
    in_ray_actor,
    legacy_actor_class,
)
from coati_relay.parts import LivenessProbe, get_within

logger = logging.getLogger(__name__)

MAKER_CONCURRENCY_GROUPS = {"experience_io": 1, "model_io": 1, "compute": 1}


def route_round_robin(num_items: int, start: int, num_targets: int) -> Tuple[List[List[int]], int]:
    """Item ``k`` of a batch goes to target ``(start + k) % num_targets``. Returns (item indices per target, next
    start)."""
    if num_targets < 1:
        raise ValueError(f"route_round_robin needs at least one target, got {num_targets}")
    groups = [list(range((t - start) % num_targets, num_items, num_targets)) for t in range(num_targets)]
    return groups, (start + num_items) % num_targets


def load_pushed_state(module: torch.nn.Module, state_dict: Dict[str, torch.Tensor], what: str) -> None:
    """``load_state_dict(strict=False)`` that raises when no pushed key names a weight of ``module`` (the legacy
    load silently did nothing) and warns about the keys it skips (LoRA keys on a model without LoRA layers too)."""
    own = module.state_dict()
    dense = [k for k in state_dict if "lora_A" not in k and "lora_B" not in k]
    dense_skipped = [k for k in dense if k not in own]
    if dense and len(dense_skipped) == len(dense):
        raise ValueError(f"none of the {len(dense)} pushed {what} keys names a weight of the maker's {what} "
                         f"(pushed {dense_skipped[:3]}, the maker has {list(own)[:3]}); actor keys must be Hugging "
                         "Face model keys and critic keys Critic keys (model.*, value_head.*)")
    if dense_skipped:
        logger.warning("the maker's %s has no weights %s; they are not loaded", what, dense_skipped[:8])
    if not dense and any(k not in own for k in state_dict):
        logger.warning("the maker's %s has no LoRA layers for the %d pushed LoRA tensors; build the trainer and "
                       "the maker with update_lora_weights=True to apply them", what, len(state_dict))
    module.load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=False)


class ExperienceMakerHolderImpl(LegacyActorBase):
    """The legacy maker (legacy_spec §A.5). Non-legacy keywords: ``wait_timeout_s`` bounds the wait for the initial
    sync and for the trainers to take the items; ``sampler`` picks what samples: ``"auto"`` (the default, unless
    ``$COATI_RELAY_MAKER_SAMPLER`` names another: vLLM where it runs the actor's architecture, else transformers),
    ``"vllm"``, ``"transformers"``, or ``"legacy"``, the legacy token-by-token loop. Other keywords go to generate."""

    _legacy_name = "coati.ray.experience_maker_holder.ExperienceMakerHolder"

    def __init__(self, detached_trainer_name_list: List[str], strategy_fn: Callable[[], Any],
                 model_fn: Callable[[], Tuple[Any, Any, Any, Any]], env_info: Optional[Dict[str, str]] = None,
                 sync_models_from_trainers: bool = False, buffer_cpu_offload: bool = True, kl_coef: float = 0.1,
                 callbacks: Optional[List[MakerCallback]] = None, eval_performance: bool = False,
                 debug: bool = False, update_lora_weights: bool = False, wait_timeout_s: float = 1800.0,
                 sampler: Optional[str] = None, **generate_kwargs: Any) -> None:
        if env_info:
            set_dist_env(env_info)
        if isinstance(detached_trainer_name_list, str) or not detached_trainer_name_list:
            raise ValueError("detached_trainer_name_list must be a non-empty list of trainer names, got "
                             f"{detached_trainer_name_list!r}")
        self.target_trainer_name_list, self.target_trainer_list = list(detached_trainer_name_list), []
        self.strategy = build_strategy(strategy_fn, "ExperienceMakerHolder")
        self.buffer_cpu_offload, self.kl_coef, self.wait_timeout_s = buffer_cpu_offload, kl_coef, float(wait_timeout_s)
        with self.strategy.model_init_context():
            actor, critic, reward_model, initial_model = model_fn()
        self.generate_kwargs = self._set_default_generate_kwargs(generate_kwargs, actor)
        self.callbacks: List[MakerCallback] = list(callbacks or [])
        if eval_performance:
            self.callbacks.append(ExperienceMakerPerformanceEvaluator(*map(get_model_numel, (
                actor, critic, initial_model, reward_model))))
        models = self.strategy.prepare(actor, critic, reward_model, initial_model)
        for model, role in ((models[0], "actor"), (models[1], "critic")):  # the models that sample or take pushes
            self.strategy.check_parameters_readable(model, f"the maker's sampling and weight loads of its {role}")
        self.experience_maker = NaiveExperienceMaker(*models, kl_coef=kl_coef)
        self.callbacks += maker_observers(self.experience_maker)  # e.g. compare's recorder, off unless it runs
        self.sampler_kind = resolve_sampler(sampler or default_sampler(), self._actor_model())
        self._sampler: Optional[EngineSampler] = None
        if self.sampler_kind != "legacy":
            self._sampler = EngineSampler(self.sampler_kind, seed=torch.initial_seed() % 2 ** 31)
            self.experience_maker.sample_fn = self._sample_with_engine
        self._version = 0  # completed weight pushes while no engine backend holds the version (then: its own)
        self._liveness: Optional[LivenessProbe] = None
        self._model_visit_lock = threading.Lock()  # held by one generation or one shard load at a time
        self._pushes = threading.Condition()  # guards _open_pushes; generation starts only when it is 0
        self._open_pushes, self._target_idx, self._debug = 0, 0, debug
        self._is_fully_initialized = not sync_models_from_trainers
        self._update_lora_weights = update_lora_weights
        if update_lora_weights:
            self.actor_lora_constructor, self.critic_lora_constructor = LoRAConstructor(), LoRAConstructor()
        if debug:
            enable_debug_logging(logger)
        logger.debug("[maker] sampler: %s", self.sampler_kind)

    @staticmethod
    def _set_default_generate_kwargs(generate_kwargs: Dict[str, Any], actor: Any) -> Dict[str, Any]:
        """The legacy defaults: the HF model's input-preparation hooks, when the caller gave none."""
        return default_generate_kwargs(generate_kwargs, getattr(actor, "model", actor))

    # -- sampling ------------------------------------------------------------------------------------------------
    def _actor_model(self) -> torch.nn.Module:
        """The actor's Hugging Face model (``Actor.model``), the one pushes load into."""
        return self.strategy.unwrap_model(self.experience_maker.actor)

    def _sample_with_engine(self, input_ids: torch.Tensor, return_action_mask: bool = True, **kwargs: Any):
        """``Actor.generate`` on the engine backend, started on the actor (at the pushes counted so far) at first."""
        self._sampler.start(self._actor_model(), self._version)
        return self._sampler.generate(self._actor_model(), input_ids, return_action_mask, **kwargs)

    def _backend(self) -> Any:
        return self._sampler.backend if self._sampler is not None else None

    # -- trainers ------------------------------------------------------------------------------------------------
    def update_target_trainer_list(self) -> None:
        if not self.target_trainer_list:
            self.target_trainer_list = [get_named_actor(n, "trainer") for n in self.target_trainer_name_list]

    def _trainers_alive(self) -> bool:
        """False once every target trainer has died (the engine's liveness probe, kept across calls)."""
        if self._liveness is None:
            self._liveness = LivenessProbe(dict(zip(self.target_trainer_name_list, self.target_trainer_list)))
        return len(self._liveness.dead()) < len(self._liveness.names())

    def _call_trainers(self, method: str, *args: Any) -> None:
        if in_ray_actor():
            self.update_target_trainer_list()
            get_within([getattr(t, method).remote(*args) for t in self.target_trainer_list], 60.0,
                       f"{method} on the trainers")

    def _producer_identity(self) -> Tuple[str, Any]:
        ctx = ray.get_runtime_context()
        return ctx.get_actor_name() or ctx.get_actor_id(), ctx.current_actor

    # -- working loop --------------------------------------------------------------------------------------------
    def _fully_initialized(self) -> bool:
        return self._is_fully_initialized

    def _get_ready(self) -> None:
        """Waits (polling every second) for the initial full sync when one was asked for."""
        deadline = time.monotonic() + self.wait_timeout_s
        while not self._is_fully_initialized:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no trainer called sync_models_to_remote_makers within {self.wait_timeout_s:.0f}s"
                                   "; call it, or build the maker with sync_models_from_trainers=False")
            if in_ray_actor():
                self.update_target_trainer_list()
                if not self._trainers_alive():
                    raise RuntimeError("every trainer of this maker has died while it waited for the initial sync")
            time.sleep(1.0)

    def workingloop(self, dataloader_fn: Callable[[], Iterable], num_epochs: int = 1, num_steps: int = 0) -> None:
        """Makes experience from ``dataloader_fn()`` (built here): ``num_steps`` batches cycling the loader when
        ``num_steps > 0``, else ``num_epochs`` passes."""
        self._get_ready()
        self._notify("on_loop_start")
        dataloader, registered = dataloader_fn(), in_ray_actor()
        if registered:
            self._call_trainers("buffer_register_producer", *self._producer_identity())
        try:
            for batch in self._batches(dataloader, num_epochs, num_steps):
                self._inference_step(batch)
            self._notify("on_loop_end")
        finally:
            if registered:
                self._call_trainers("buffer_producer_finished", self._producer_identity()[0])

    @staticmethod
    def _batches(dataloader: Iterable, num_epochs: int, num_steps: int) -> Iterator[Any]:
        steps = 0
        for _ in itertools.count() if num_steps > 0 else range(num_epochs):
            before = steps
            for batch in dataloader:
                yield batch
                steps += 1
                if steps == num_steps:
                    return
            if num_steps > 0 and steps == before:
                raise ValueError("the dataloader built by dataloader_fn() yields no batch; give it at least one "
                                 "(check batch_size against the dataset and drop_last)")

    def _make_experience(self, inputs: Any) -> Experience:
        if not isinstance(inputs, (torch.Tensor, dict)):
            raise ValueError(f"a dataloader batch must be a Tensor of input ids or a dict of model inputs, got "
                             f"{type(inputs).__name__}")
        inputs = {"input_ids": inputs} if isinstance(inputs, torch.Tensor) else inputs
        max_length, ids = self.generate_kwargs.get("max_length"), inputs.get("input_ids")
        if isinstance(max_length, int) and isinstance(ids, torch.Tensor) and ids.dim() == 2 and \
                max_length <= ids.size(1):
            raise ValueError(f"max_length={max_length} leaves no token to generate after prompts of {ids.size(1)} "
                             "tokens: max_length counts the prompt and the response; give the maker a max_length "
                             "above the longest prompt (or shorten the prompts)")
        return self.experience_maker.make_experience(**inputs, **self.generate_kwargs)

    def _inference_step(self, batch: Any) -> None:
        self._notify("on_batch_start")
        with self._pushes:
            if not self._pushes.wait_for(lambda: self._open_pushes == 0, timeout=self.wait_timeout_s):
                raise TimeoutError(f"a weight push stayed open (chunk_start without chunk_end) for "
                                   f"{self.wait_timeout_s:.0f}s; a trainer died mid-push?")
        with self._locked_model():  # a push opened since then waits for this generation, as legacy chunk_start did
            self._notify("on_make_experience_start")
            experience = self._make_experience(batch)
            self._notify("on_make_experience_end", experience)
        self._notify("on_send_start")
        if self.buffer_cpu_offload:
            experience.to_device("cpu")
        self._send_items(experience)
        self._notify("on_send_end")
        self._notify("on_batch_end")

    def _send_items(self, experience: Experience) -> None:
        """Each item to the next trainer round robin; waits until the trainers have taken them."""
        items = split_experience_batch(experience)
        self.update_target_trainer_list()
        groups, self._target_idx = route_round_robin(len(items), self._target_idx, len(self.target_trainer_list))
        refs = [trainer.buffer_extend.remote([items[k] for k in group])
                for trainer, group in zip(self.target_trainer_list, groups) if group]
        logger.debug("[maker] sending %d items", len(items))
        get_within(refs, self.wait_timeout_s, "sending experience to the trainers")

    # -- weights -------------------------------------------------------------------------------------------------
    @ray.method(concurrency_group="model_io")
    @torch.no_grad()
    def update_experience_maker(self, new_actor_state_dict: Optional[Dict[str, torch.Tensor]] = None,
                                new_actor_lora_config_dict: Optional[Dict[str, Any]] = None,
                                new_critic_state_dict: Optional[Dict[str, torch.Tensor]] = None,
                                new_critic_lora_config_dict: Optional[Dict[str, Any]] = None,
                                fully_update: bool = False, chunk_start: Optional[bool] = None,
                                chunk_end: Optional[bool] = None) -> None:
        """One call of the chunked push: ``chunk_start`` opens a push (no generation starts until every open push
        has ended) and waits for a generation in flight, payload calls load actor and critic shards, ``chunk_end``
        closes the push (and ends a full initial sync). Pushes of several trainers may overlap (legacy: one lock
        held from start to end, which deadlocked two trainers pushing to one maker)."""
        with self._locked_model():  # lock, then condition (generation takes them one after the other)
            if chunk_start:
                with self._pushes:
                    self._open_pushes += 1
                if self._debug:
                    tracemalloc.start()
            for what, state_dict, configs in (("actor", new_actor_state_dict, new_actor_lora_config_dict),
                                              ("critic", new_critic_state_dict, new_critic_lora_config_dict)):
                if state_dict is not None:
                    self._load(what, state_dict, configs, self._update_lora_weights and not fully_update)
        if chunk_end:
            self._end_push(fully_update)

    @contextmanager
    def _locked_model(self) -> Iterator[None]:
        if not self._model_visit_lock.acquire(timeout=self.wait_timeout_s):
            raise TimeoutError(f"the models stayed locked (a generation or a weight load) for "
                               f"{self.wait_timeout_s:.0f}s")
        try:
            yield
        finally:
            self._model_visit_lock.release()

    def _load(self, what: str, state_dict: Dict[str, torch.Tensor], lora_configs: Optional[Dict[str, Any]],
              lora: bool) -> None:
        """A pushed shard into the actor's HF model (HF keys; what it changed also into a started vLLM engine) or
        into the critic (Critic keys); a LoRA push as each layer's ``W0 + delta``."""
        module = self.strategy.unwrap_model(getattr(self.experience_maker, what))
        if lora:
            constructor: LoRAConstructor = getattr(self, f"{what}_lora_constructor")
            device = next(module.parameters()).device
            state_dict = constructor.reconstruct_increase({k: v.to(device) for k, v in state_dict.items()},
                                                          lora_configs)
            constructor.load_state_dict_increase(module, state_dict)
            logger.debug("[maker] LoRA push: %d %s weights rebuilt from their adapters", len(state_dict), what)
        else:
            load_pushed_state(module, state_dict, what)
        if what == "actor" and self._sampler is not None:
            self._sampler.load(module, state_dict.keys())

    def _end_push(self, fully_update: bool) -> None:
        with self._pushes:
            if not self._open_pushes:
                raise RuntimeError("update_experience_maker(chunk_end=True) without a chunk_start first")
            if self._debug and tracemalloc.is_tracing():
                current, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                logger.debug("[maker] weight update memory: current %.1f MB, peak %.1f MB", current / 2**20,
                             peak / 2**20)
            if self._backend() is None:
                self._version += 1
            else:
                self._backend().weight_version += 1
            self._is_fully_initialized = self._is_fully_initialized or fully_update
            self._open_pushes -= 1
            self._pushes.notify_all()

    # -- non-legacy ----------------------------------------------------------------------------------------------
    def get_weight_version(self) -> int:
        """Completed weight pushes received so far: the version of the engine backend that samples (counted here
        before it starts, and with the legacy loop)."""
        return self._version if self._backend() is None else self._backend().weight_version

    def _notify(self, hook: str, *args: Any) -> None:
        """Calls ``hook`` (a `MakerCallback` method name) on every callback, in order."""
        for cb in self.callbacks:
            getattr(cb, hook)(*args)


ExperienceMakerHolder = legacy_actor_class(ExperienceMakerHolderImpl, MAKER_CONCURRENCY_GROUPS)
