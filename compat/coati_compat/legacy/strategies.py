"""Legacy ``coati.trainer.strategies``: ``NaiveStrategy``, ``DDPStrategy``, ``LowLevelZeroStrategy`` and
``GeminiStrategy`` (and the 2023 ``ColossalAIStrategy``: stage 3 is Gemini, 1-2 LowLevelZero) with the legacy method
surface, as fronts on the engine: each prepared model is one `coati_relay.training.TrainingBackend` (built with
``TrainingBackend.around`` from the script's model and optimizer), which ``backward``, ``optimizer_step`` and the
checkpoint methods call. Plugins (``coati_relay.training.plugins``): ddp -> ``"ddp"``, LowLevelZero -> ``"zero2"``,
Gemini -> ``"gemini"``, naive -> none; the legacy keywords map onto their settings through
`coati_compat.legacy.tables.plugin_settings`.

Without CUDA, LowLevelZero and Gemini train with ``"ddp"`` (one RuntimeWarning per plugin) and process groups use
gloo. ``unwrap_model`` follows the reference version: the Hugging Face model for an ``Actor``, the ``Critic``
wrapper for a critic, so that pushed state-dict keys are HF keys (actor) and ``Critic`` keys (critic).
Where the plugin in use keeps no fp32 master weights (naive, ddp, every CPU fallback), the backend gives fp16/bf16
models an optimizer over fp32 masters with the strategy's loss scale (`coati_relay.training.master_weights`), and it
stops at a non-finite loss or weight (`coati_relay.training.finite_checks`). Checkpoint call forms of both releases:
`coati_compat.legacy.strategy_checkpoint`; the files: `coati_relay.training.checkpoint_files`. Deviations from the
legacy code: LowLevelZero's state-dict shards use the generic path (the legacy one called a method that
does not exist); a module without trainable parameters is not wrapped (DDP rejects it).
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import random
import sys
from abc import ABC
from collections import OrderedDict
from typing import Any, ContextManager, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from coati_compat.deprecations import deprecated_api
from coati_compat.legacy import strategy_checkpoint as checkpoint
from coati_compat.legacy.model_base import Actor
from coati_compat.legacy.replay_buffer import buffer_dataloader
from coati_compat.legacy.tables import CLASS_PLUGINS, LEGACY_PRECISION, LOSS_SCALE_KEYS, plugin_settings
from coati_relay.training import checkpoint_files
from coati_relay.training.booster_backend import TrainingBackend
from coati_relay.training.distributed import RENDEZVOUS_ENV as DIST_ENV
from coati_relay.training.distributed import init_process_group_from_env
from coati_relay.training.plugins import resolve_plugin

logger = logging.getLogger(__name__)

DIST_TIMEOUT = datetime.timedelta(minutes=30)


def _init_process_group_from_env(required: bool) -> None:
    """Joins the process group RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT describe, through the engine's rendezvous
    (`coati_relay.training.distributed.init_process_group_from_env`: inside Ray one that cannot lose its port,
    elsewhere the launcher's); without them, an error where ``required``."""
    if dist.is_initialized():
        return
    missing = [k for k in DIST_ENV if k not in os.environ]
    if missing:
        if required:
            raise ValueError(f"the strategy needs the environment variables {list(DIST_ENV)}; {missing} are not set "
                             "(pass env_info to the trainer or maker, or call coati.ray.utils.set_dist_env first)")
        return
    init_process_group_from_env(timeout_s=DIST_TIMEOUT.total_seconds())


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _unwrap_booster(model: nn.Module) -> nn.Module:
    """The module inside a booster wrapper (TorchDDPModel, LowLevelZeroModel, GeminiDDP); else ``model``."""
    if "colossalai.interface" in sys.modules:
        from colossalai.interface import ModelWrapper

        if isinstance(model, ModelWrapper):
            return model.unwrap(unwrap_peft=False)
    return model


def _keep_actor_generate(backend: TrainingBackend) -> nn.Module:
    """The backend's model with its ``Actor``'s ``generate``: the 2023 strategies gave back an ``Actor`` around the
    wrapped model, and scripts of that time (the community Ray example) sample with ``prepared_actor.generate(...)``."""
    boosted, inner = backend.model, backend.unwrapped()
    if boosted is not inner and isinstance(inner, Actor) and not hasattr(boosted, "generate"):
        boosted.generate = inner.generate  # a plain attribute (nn.Module.__setattr__ keeps non-modules as such)
    return boosted


def _optimizer_chain(optimizer: Any) -> List[Any]:
    """``optimizer`` and the optimizers it wraps (a plugin's wrapper, fp32 masters, the script's optimizer)."""
    chain = []
    while optimizer is not None and len(chain) < 4:
        chain.append(optimizer)
        optimizer = getattr(optimizer, "optim", None)
    return chain


def _role(model: nn.Module) -> str:
    """What errors call a prepared model: "actor", "critic", or its class name."""
    for cls in type(model).__mro__:
        if cls.__name__ in ("Actor", "Critic", "RewardModel"):
            return {"Actor": "actor", "Critic": "critic", "RewardModel": "reward model"}[cls.__name__]
    return type(model).__name__


@deprecated_api("coati.trainer.strategies.DistributedSampler")
class DistributedSampler:
    """The legacy prompt sampler: each of ``num_replicas`` ranks owns every num_replicas-th index (the tail that
    does not divide evenly is dropped); ``sample(batch_size)`` draws without replacement from the rank's share."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"need num_replicas >= 1 and 0 <= rank < num_replicas, got {num_replicas}, {rank}")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.num_samples = len(dataset) // num_replicas
        self.indices = list(range(rank, self.num_samples * num_replicas, num_replicas))

    def sample(self, batch_size: int) -> List[Any]:
        if batch_size > len(self.indices):
            raise ValueError(f"cannot sample {batch_size} items from this rank's {len(self.indices)}")
        return [self.dataset[i] for i in np.random.choice(self.indices, batch_size, replace=False)]


@deprecated_api("coati.trainer.strategies.Strategy")
class Strategy(ABC):
    """A training strategy: process group, plugin, one engine `TrainingBackend` per prepared model, and the legacy
    methods. ``plugin_name`` is the engine plugin actually used (None: no plugin, the naive strategy)."""

    def __init__(self, plugin: Optional[str] = None, plugin_options: Optional[Dict[str, Any]] = None,
                 seed: int = 42, loss_scale: Optional[Dict[str, Any]] = None) -> None:
        self.seed = seed
        self.loss_scale_options: Dict[str, Any] = dict(loss_scale or {})
        self.plugin_name: Optional[str] = None
        self.plugin_options: Dict[str, Any] = {}
        if plugin is not None:
            self.plugin_name, self.plugin_options = resolve_plugin(plugin, plugin_options, allow_cpu_fallback=True)
        self.backends: List[TrainingBackend] = []
        self.setup_distributed()

    def setup_distributed(self) -> None:
        """Initialises the process group (plugins) and seeds Python, NumPy and torch."""
        _init_process_group_from_env(required=True)
        _seed_everything(self.seed)

    def model_init_context(self) -> ContextManager[None]:
        return contextlib.nullcontext()

    def _prepare_one(self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                     **extras: Any) -> TrainingBackend:
        backend = TrainingBackend.around(model, optimizer, plugin=self.plugin_name, plugin_options=self.plugin_options,
                                         loss_scale=self.loss_scale_options, name=_role(model), **extras)
        self.backends.append(backend)
        return backend

    def _backend(self, model: Optional[nn.Module] = None, optimizer: Any = None) -> Optional[TrainingBackend]:
        """The backend that `prepare` gave ``optimizer`` (or the optimizer inside its wrappers; else ``model``);
        None when it gave neither."""
        for backend in self.backends:
            if optimizer is not None and any(o is optimizer for o in _optimizer_chain(backend.optimizer)):
                return backend
        for backend in self.backends:
            if model is not None and backend.model is model:
                return backend
        return None

    def _training_backend(self, model: Optional[nn.Module], optimizer: Any) -> TrainingBackend:
        """The backend to train ``model`` with ``optimizer``; the naive strategy wraps ones it did not prepare, as
        they are (no master weights)."""
        backend = self._backend(model, optimizer)
        if backend is not None:
            return backend
        if self.plugin_name is None and model is not None:
            backend = TrainingBackend.around(model, optimizer, master_weights=False, name=_role(model))
            self.backends.append(backend)
            return backend
        raise ValueError(f"{type(self).__name__}: this optimizer (and model) did not come from strategy.prepare; "
                         "prepare (model, optimizer) first and train what it returns")

    def prepare(self, *args: Any) -> Any:
        """Each argument: a module, a ``(model, optimizer)`` pair or a dict of ``Booster.boost`` keywords; returns
        them boosted in the same form (a single argument comes back alone)."""
        results: List[Any] = []
        for arg in args:
            if isinstance(arg, nn.Module):
                results.append(_keep_actor_generate(self._prepare_one(arg)))
            elif isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[0], nn.Module):
                backend = self._prepare_one(arg[0], arg[1])
                results.append((_keep_actor_generate(backend), backend.optimizer))
            elif isinstance(arg, dict):
                kwargs = {k: v for k, v in arg.items() if v is not None}
                if "model" not in kwargs:
                    raise ValueError(f"prepare: a dict argument needs a 'model' entry, got keys {sorted(arg)}")
                backend = self._prepare_one(kwargs.pop("model"), kwargs.pop("optimizer", None), **kwargs)
                results.append({"model": backend.model, **({"optimizer": backend.optimizer} if backend.optimizer
                                                          is not None else {}), **backend.boost_extras})
            else:
                raise TypeError(f"prepare expects modules, (model, optimizer) pairs or dicts, got {type(arg).__name__}")
        return results[0] if len(results) == 1 else results

    def backward(self, loss: torch.Tensor, model: nn.Module, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        """``loss.backward()`` through the model's backend (fp16 loss scale under masters); it stops at a non-finite
        loss, naming ``kwargs["loss_name"]`` and the non-finite fields of ``kwargs["batch"]`` where given."""
        self._training_backend(model, optimizer).backward(loss, batch=kwargs.get("batch"),
                                                          loss_name=kwargs.get("loss_name"))

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        """One step of the optimizer's backend; it stops at a non-finite weight."""
        self._training_backend(None, optimizer).step()

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The model without the booster wrapper; for an ``Actor``, its Hugging Face model."""
        backend = self._backend(model)
        inner = backend.unwrapped() if backend is not None else _unwrap_booster(model)
        return inner.model if isinstance(inner, Actor) else inner

    def _full_state_dict(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """The state dict of `unwrap_model` (its backend gathers Gemini's chunks: every rank calls)."""
        backend = self._backend(model)
        if backend is None:
            return self.unwrap_model(model).state_dict()
        state_dict = backend.full_state_dict()
        if isinstance(backend.unwrapped(), Actor):
            state_dict = OrderedDict((k[len("model."):], v) for k, v in state_dict.items() if k.startswith("model."))
        return state_dict

    def get_model_state_dict_shard(self, model: nn.Module, shard_size: Optional[int] = None,
                                   requires_grad_only: bool = False) -> Iterator[Dict[str, torch.Tensor]]:
        """Yields the state dict of ``unwrap_model(model)`` in shards of at least ``shard_size`` bytes (the last
        one may be smaller; None: one shard). ``requires_grad_only`` keeps only trainable parameters."""
        if shard_size is not None and (not isinstance(shard_size, int) or shard_size < 1):
            raise ValueError(f"shard_size must be a positive number of bytes or None, got {shard_size!r}")
        state_dict = self._full_state_dict(model)
        if requires_grad_only:
            trainable = {n for n, p in self.unwrap_model(model).named_parameters() if p.requires_grad}
            state_dict = OrderedDict((k, v) for k, v in state_dict.items() if k in trainable)
        if shard_size is None:
            yield state_dict
            return
        shard: Dict[str, torch.Tensor] = OrderedDict()
        size = 0
        for name, tensor in state_dict.items():
            shard[name] = tensor
            size += tensor.numel() * tensor.element_size()
            if size >= shard_size:
                yield shard
                shard, size = OrderedDict(), 0
        if shard:
            yield shard

    def save_model(self, model: nn.Module, path: str, *args: Any, only_rank0: Optional[bool] = None,
                   shard: Optional[bool] = None, **kwargs: Any) -> None:
        """``save_model(model, path, only_rank0=True)``: rank 0 writes the state dict to one file (False: every
        rank writes it to its ``path``); ``shard=True``: the booster's sharded directory, ``kwargs`` its options.
        The third positional argument is ``only_rank0`` (``shard`` under ``COATI_RELAY_LEGACY_NAMES=final``);
        see `coati_compat.legacy.strategy_checkpoint`."""
        only_rank0, shard = checkpoint.model_save_form(args, only_rank0, shard)
        backend = self._backend(model)
        if backend is None:  # a model not prepared here: its plain state dict
            checkpoint_files.save_model(None, model, model, os.fspath(path), shard, not only_rank0, **kwargs)
        else:
            backend.save_model(path, shard=shard, every_rank=not only_rank0, **kwargs)

    def load_model(self, model: nn.Module, path: str, *args: Any, strict: Optional[bool] = None,
                   map_location: Any = None) -> None:
        """Loads a file or sharded directory from `save_model`; third argument ``map_location`` (reference form,
        ``strict`` fourth) or ``strict`` (final release)."""
        strict, map_location = checkpoint.load_form(args, strict, map_location)
        backend = self._backend(model)
        if backend is None:
            checkpoint_files.load_model(None, model, os.fspath(path), strict, map_location)
        else:
            backend.load_model(path, strict=strict, map_location=map_location)

    def save_optimizer(self, optimizer: torch.optim.Optimizer, path: str, only_rank0: bool = False,
                       **kwargs: Any) -> None:
        """Every rank writes the complete optimizer state to its ``path`` (``only_rank0``: rank 0 only); under
        ``COATI_RELAY_LEGACY_NAMES=final`` the booster's sharded directory (see
        `coati_compat.legacy.strategy_checkpoint`)."""
        shard, every_rank = checkpoint.optimizer_save_form(only_rank0, kwargs)
        backend = self._backend(optimizer=optimizer)
        if backend is None:
            checkpoint_files.save_optimizer(None, optimizer, os.fspath(path), shard, every_rank, **kwargs)
        else:
            backend.save_optimizer(path, shard=shard, every_rank=every_rank, **kwargs)

    def load_optimizer(self, optimizer: torch.optim.Optimizer, path: str, map_location: Any = None) -> None:
        """Loads this rank's file (or a sharded directory) written by `save_optimizer`."""
        backend = self._backend(optimizer=optimizer)
        if backend is None:
            checkpoint_files.load_optimizer(None, optimizer, os.fspath(path), map_location)
        else:
            backend.load_optimizer(path, map_location)

    def save_pretrained(self, model: nn.Module, path: str, only_rank0: bool = True, tokenizer: Any = None) -> None:
        """``save_pretrained`` of the unwrapped (Hugging Face) model and of the tokenizer."""
        if only_rank0 and checkpoint_files.rank() != 0:
            return
        unwrapped = self.unwrap_model(model)
        if not hasattr(unwrapped, "save_pretrained"):
            raise TypeError(f"{type(unwrapped).__name__} has no save_pretrained; use save_model for it")
        unwrapped.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)

    def setup_sampler(self, dataset: Any) -> DistributedSampler:
        return DistributedSampler(dataset, 1, 0)

    def _data_parallel(self) -> Tuple[int, int]:
        """(world size, rank) of the data-parallel group this strategy trains in."""
        if not dist.is_initialized():
            return 1, 0
        return dist.get_world_size(), dist.get_rank()

    def setup_dataloader(self, replay_buffer: Any, pin_memory: bool = False) -> DataLoader:
        """A ``DataLoader`` over a legacy replay buffer: batches of its ``sample_batch_size``, shuffled (the same
        permutation on every rank, a new one each pass), the last incomplete batch dropped, merged by its
        ``collate_fn``; each rank of the strategy's process group reads its own share."""
        world_size, rank = self._data_parallel()
        return buffer_dataloader(replay_buffer, world_size, rank, self.seed, pin_memory)


@deprecated_api("coati.trainer.strategies.NaiveStrategy")
class NaiveStrategy(Strategy):
    """No wrapping: plain ``loss.backward()`` and ``optimizer.step()``. Joins a process group only when the
    environment describes one."""

    def __init__(self) -> None:
        super().__init__(plugin=None)

    def setup_distributed(self) -> None:
        _init_process_group_from_env(required=False)

    def _data_parallel(self) -> Tuple[int, int]:
        return 1, 0  # wraps nothing: every process trains on all of its own data


@deprecated_api("coati.trainer.strategies.DDPStrategy")
class DDPStrategy(Strategy):
    """Torch DDP through the engine's ``"ddp"`` plugin."""

    def __init__(self, seed: int = 42) -> None:
        super().__init__(plugin=CLASS_PLUGINS["DDPStrategy"], seed=seed)

    def setup_sampler(self, dataset: Any) -> DistributedSampler:
        return DistributedSampler(dataset, dist.get_world_size(), dist.get_rank())


def _zero_options(stage: int, precision: str, placement_policy: str, reduce_bucket_size: int,
                  overlap_communication: bool, **scale_and_clip: Any) -> Dict[str, Any]:
    """The ``"zero2"`` plugin options of a legacy LowLevelZero configuration."""
    return plugin_settings("zero2", dict(stage=stage, precision=precision, placement_policy=placement_policy,
                                         reduce_bucket_size=reduce_bucket_size,
                                         overlap_communication=overlap_communication, **scale_and_clip))


def _gemini_options(shard_init: bool, search_range_m: int, min_chunk_size_m: float, **options: Any) -> Dict[str, Any]:
    """A legacy Gemini configuration (fp16 only, as the legacy code forced), its placement_policy still legacy."""
    return dict(shard_init=shard_init, search_range_m=search_range_m, min_chunk_size_m=min_chunk_size_m,
                precision=LEGACY_PRECISION, **options)


class _ColossalStrategy(DDPStrategy):
    """LowLevelZero and Gemini: their plugin on CUDA, the ddp path after a CPU fallback; the process group as for
    DDP (what ``colossalai.launch_from_torch`` did: the group of the launcher's rendezvous, the local rank's device,
    the seed)."""

    def __init__(self, plugin: str, options: Dict[str, Any], seed: int) -> None:
        loss_scale = {k: options[k] for k in LOSS_SCALE_KEYS}
        Strategy.__init__(self, plugin=plugin, plugin_options=plugin_settings(plugin, options), seed=seed,
                          loss_scale=loss_scale)


@deprecated_api("coati.trainer.strategies.LowLevelZeroStrategy")
class LowLevelZeroStrategy(_ColossalStrategy):
    """ZeRO stage 1/2 through the engine's ``"zero2"`` plugin (``placement_policy="cpu"``: CPU offload)."""

    def __init__(self, stage: int = 2, precision: str = LEGACY_PRECISION, seed: int = 42,
                 placement_policy: str = "cuda",
                 reduce_bucket_size: int = 12 * 1024 ** 2, overlap_communication: bool = True,
                 initial_scale: float = 2 ** 16, growth_factor: float = 2, backoff_factor: float = 0.5,
                 growth_interval: int = 1000, hysteresis: int = 2, min_scale: float = 1, max_scale: float = 2 ** 32,
                 max_norm: float = 0.0, norm_type: float = 2.0) -> None:
        options = _zero_options(stage, precision, placement_policy, reduce_bucket_size, overlap_communication,
                                initial_scale=initial_scale, growth_factor=growth_factor,
                                backoff_factor=backoff_factor, growth_interval=growth_interval, hysteresis=hysteresis,
                                min_scale=min_scale, max_scale=max_scale, max_norm=max_norm, norm_type=norm_type)
        super().__init__(CLASS_PLUGINS["LowLevelZeroStrategy"], options, seed)


@deprecated_api("coati.trainer.strategies.GeminiStrategy")
class GeminiStrategy(_ColossalStrategy):
    """Gemini (chunked ZeRO-3, fp16) through the engine's ``"gemini"`` plugin."""

    def __init__(self, seed: int = 42, shard_init: bool = False, placement_policy: str = "auto",
                 shard_param_frac: float = 1.0, offload_optim_frac: float = 0.0, offload_param_frac: float = 0.0,
                 pin_memory: bool = True, force_outputs_fp32: bool = False, search_range_m: int = 32,
                 hidden_dim: Optional[int] = None, min_chunk_size_m: float = 32, gpu_margin_mem_ratio: float = 0.0,
                 initial_scale: float = 2 ** 16, growth_factor: float = 2, backoff_factor: float = 0.5,
                 growth_interval: int = 1000, hysteresis: int = 2, min_scale: float = 1, max_scale: float = 2 ** 32,
                 max_norm: float = 0.0, norm_type: float = 2.0) -> None:
        options = _gemini_options(shard_init, search_range_m, min_chunk_size_m, placement_policy=placement_policy,
                                  shard_param_frac=shard_param_frac, offload_optim_frac=offload_optim_frac,
                                  offload_param_frac=offload_param_frac, pin_memory=pin_memory,
                                  force_outputs_fp32=force_outputs_fp32, hidden_dim=hidden_dim,
                                  gpu_margin_mem_ratio=gpu_margin_mem_ratio, initial_scale=initial_scale,
                                  growth_factor=growth_factor, backoff_factor=backoff_factor,
                                  growth_interval=growth_interval, hysteresis=hysteresis, min_scale=min_scale,
                                  max_scale=max_scale, max_norm=max_norm, norm_type=norm_type)
        super().__init__(CLASS_PLUGINS["GeminiStrategy"], options, seed)


@deprecated_api("coati.trainer.strategies.ColossalAIStrategy")
class ColossalAIStrategy(_ColossalStrategy):
    """The 2023 (pre-Booster) strategy: ``stage=3`` is Gemini (``"gemini"``, fp16 as the legacy code forced),
    ``stage=1``/``2`` LowLevelZero (``"zero2"``); ``placement_policy="cpu"`` offloads."""

    def __init__(self, stage: int = 3, precision: str = LEGACY_PRECISION, seed: int = 42, shard_init: bool = False,
                 placement_policy: str = "cuda", pin_memory: bool = True, force_outputs_fp32: bool = False,
                 search_range_mb: int = 32, hidden_dim: Optional[int] = None, min_chunk_size_mb: float = 32,
                 gpu_margin_mem_ratio: float = 0.0, reduce_bucket_size: int = 12 * 1024 ** 2,
                 overlap_communication: bool = True, initial_scale: float = 2 ** 16, growth_factor: float = 2,
                 backoff_factor: float = 0.5, growth_interval: int = 1000, hysteresis: int = 2, min_scale: float = 1,
                 max_scale: float = 2 ** 32, max_norm: float = 0.0, norm_type: float = 2.0) -> None:
        if stage not in (1, 2, 3):
            raise ValueError(f"ColossalAIStrategy: stage must be 1, 2 or 3, got {stage!r}")
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"ColossalAIStrategy: precision must be 'fp32' or 'fp16', got {precision!r}")
        self.stage = stage
        scale_and_clip = dict(initial_scale=initial_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                              growth_interval=growth_interval, hysteresis=hysteresis, min_scale=min_scale,
                              max_scale=max_scale, max_norm=max_norm, norm_type=norm_type)
        if stage == 3:
            if placement_policy not in ("cpu", "cuda"):
                raise ValueError(f"placement_policy must be 'cpu' or 'cuda', got {placement_policy!r}")
            options = _gemini_options(shard_init, search_range_mb, min_chunk_size_mb,
                                      placement_policy=placement_policy, pin_memory=pin_memory,
                                      force_outputs_fp32=force_outputs_fp32, hidden_dim=hidden_dim,
                                      gpu_margin_mem_ratio=gpu_margin_mem_ratio, **scale_and_clip)
            plugin = CLASS_PLUGINS["GeminiStrategy"]
        else:
            options = _zero_options(stage, precision, placement_policy, reduce_bucket_size, overlap_communication,
                                    **scale_and_clip)
            plugin = CLASS_PLUGINS["LowLevelZeroStrategy"]
        super().__init__(plugin, options, seed)
