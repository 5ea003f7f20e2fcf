"""Legacy ``coati.trainer.strategies`` (naive, ddp, LowLevelZero, Gemini and the 2023 ``ColossalAIStrategy``) as
fronts on the engine: each prepared model is one `coati_relay.training.TrainingBackend`, kept in a
`coati_relay.training.backend_set.BackendSet`, which training, state dicts and checkpoints go through (call forms:
`coati_compat.legacy.strategy_checkpoint`). Legacy keywords map onto a plugin through `coati_compat.legacy.tables`.
Without CUDA, LowLevelZero and Gemini train with ``"ddp"`` (one RuntimeWarning per plugin) over gloo.
``unwrap_model`` follows the reference version: an ``Actor``'s Hugging Face model, a ``Critic`` as it is (pushed keys:
HF keys, ``Critic`` keys). Deviations: LowLevelZero's state-dict shards use the generic path (the legacy one called a
method that does not exist); a module without trainable parameters is not wrapped (DDP rejects it). Under Gemini
(ZeRO-3) ``save_pretrained`` is refused, as the legacy stage-3 strategy refused it, and so are sampling from and
loading into a prepared model's parameters once Gemini frees them outside its hooks (above its keep-gathered size).
"""
from __future__ import annotations

import contextlib
from abc import ABC
from typing import Any, ContextManager, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy import strategy_checkpoint as checkpoint
from coati_compat.legacy.model_base import Actor
from coati_compat.legacy.replay_buffer import buffer_dataloader
from coati_compat.legacy.tables import LOSS_SCALE_KEYS, legacy_options, plugin_settings
from coati_relay.parts import (
    BackendSet,
    TrainingBackend,
    checkpoint_files,
    init_process_group_from_env,
    refusal,
    releases_parameters,
    resolve_plugin,
    seed_everything,
    state_dict_shards,
)

DIST_TIMEOUT_S = 30 * 60
_ENV_ADVICE = "pass env_info to the trainer or maker, or call coati.ray.utils.set_dist_env first"


def _keep_actor_generate(backend: TrainingBackend) -> nn.Module:
    """The backend's model with its ``Actor``'s ``generate`` (2023 scripts sample with ``prepared_actor.generate``);
    under Gemini it refuses to sample once Gemini frees the actor's chunks outside its hooks."""
    boosted, inner = backend.model, backend.unwrapped()
    if boosted is not inner and isinstance(inner, Actor) and not hasattr(boosted, "generate"):
        # a plain attribute (nn.Module.__setattr__ keeps non-modules as such)
        boosted.generate = _gemini_generate(backend, inner) if backend.shards_parameters else inner.generate
    return boosted


def _gemini_generate(backend: TrainingBackend, actor: Actor) -> Any:
    def generate(*args: Any, **kwargs: Any) -> Any:
        if releases_parameters(backend.model):
            raise RuntimeError(refusal("generate", "actor"))
        return actor.generate(*args, **kwargs)

    return generate


def _role(model: nn.Module) -> str:
    """What errors call a prepared model: "actor", "critic", "reward model", or its class name."""
    names = {"Actor": "actor", "Critic": "critic", "RewardModel": "reward model"}
    return next((names[c.__name__] for c in type(model).__mro__ if c.__name__ in names), type(model).__name__)


def _keywords(local_vars: Dict[str, Any]) -> Dict[str, Any]:
    """A constructor's keyword arguments (its ``locals()``) that reach the plugin."""
    return {k: v for k, v in local_vars.items() if k not in ("self", "seed", "__class__")}


@deprecated_api("coati.trainer.strategies.DistributedSampler")
class DistributedSampler:
    """Each of ``num_replicas`` ranks owns every num_replicas-th index (the uneven tail dropped); ``sample`` draws
    without replacement from the rank's share."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"need num_replicas >= 1 and 0 <= rank < num_replicas, got {num_replicas}, {rank}")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.num_samples = len(dataset) // num_replicas
        self.indices = list(range(rank, self.num_samples * num_replicas, num_replicas))

    def sample(self, batch_size: int) -> List[Any]:
        if batch_size > len(self.indices):
            raise ValueError(f"cannot sample {batch_size} items from this rank's {len(self.indices)}")
        return [self.dataset[i] for i in np.random.choice(self.indices, batch_size, replace=False)]


@deprecated_api("coati.trainer.strategies.Strategy")
class Strategy(ABC):
    """Process group, plugin and one `TrainingBackend` per prepared model; ``plugin_name``: the plugin used."""

    def __init__(self, plugin: Optional[str] = None, plugin_options: Optional[Dict[str, Any]] = None,
                 seed: int = 42, loss_scale: Optional[Dict[str, Any]] = None) -> None:
        self.seed, self.loss_scale_options, self.backends = seed, dict(loss_scale or {}), BackendSet()
        self.plugin_name, self.plugin_options = (None, {}) if plugin is None else resolve_plugin(
            plugin, plugin_options, allow_cpu_fallback=True)
        self.setup_distributed()

    def setup_distributed(self) -> None:
        """Joins the process group the environment describes (the engine's rendezvous); seeds every RNG."""
        init_process_group_from_env(DIST_TIMEOUT_S, advice=_ENV_ADVICE)
        seed_everything(self.seed)

    def model_init_context(self) -> ContextManager[None]:
        return contextlib.nullcontext()

    def _prepare_one(self, model: nn.Module, optimizer: Any = None, **extras: Any) -> TrainingBackend:
        return self.backends.add(TrainingBackend.around(
            model, optimizer, plugin=self.plugin_name, plugin_options=self.plugin_options,
            loss_scale=self.loss_scale_options, name=_role(model), **extras))

    def _training_backend(self, model: Optional[nn.Module], optimizer: Any) -> TrainingBackend:
        """The backend of ``model``/``optimizer``; the naive strategy wraps ones it did not prepare as they are."""
        name = _role(model) if model is not None else "model"
        return self.backends.training(model, optimizer, wrap_unknown=self.plugin_name is None, name=name)

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
        """Through the model's backend; a non-finite loss stops it, naming ``loss_name`` and ``batch`` fields."""
        self._training_backend(model, optimizer).backward(loss, kwargs.get("batch"), kwargs.get("loss_name"))

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        """One step of the optimizer's backend; it stops at a non-finite weight."""
        self._training_backend(None, optimizer).step()

    def check_parameters_readable(self, model: nn.Module, what: str) -> None:
        """Raises RuntimeError where ``what`` would read or write ``model``'s parameters outside the hooks of the
        Gemini that holds them (Gemini frees them there: above its keep-gathered size)."""
        backend = self.backends.find(model)
        if backend is not None and backend.shards_parameters and releases_parameters(backend.model):
            raise RuntimeError(refusal(what, backend.name))

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The model without the booster wrapper; for an ``Actor``, its Hugging Face model."""
        inner = self.backends.unwrapped(model)
        return inner.model if isinstance(inner, Actor) else inner

    def get_model_state_dict_shard(self, model: nn.Module, shard_size: Optional[int] = None,
                                   requires_grad_only: bool = False) -> Iterator[Dict[str, torch.Tensor]]:
        """The state dict of ``unwrap_model(model)`` (Gemini gathers: every rank calls) in shards of at least
        ``shard_size`` bytes (None: one shard); ``requires_grad_only``: trainable parameters only."""
        submodule = "model" if isinstance(self.backends.unwrapped(model), Actor) else None
        return state_dict_shards(self.backends.module_state(model, submodule, requires_grad_only), shard_size)

    def save_model(self, model: nn.Module, path: str, *args: Any, only_rank0: Optional[bool] = None,
                   shard: Optional[bool] = None, **kwargs: Any) -> None:
        """One file from rank 0 (``only_rank0=False``: one per rank); ``shard=True``: the booster's directory."""
        only_rank0, shard = checkpoint.model_save_form(args, only_rank0, shard)
        self.backends.files(model=model).save_model(path, shard=shard, every_rank=not only_rank0, **kwargs)

    def load_model(self, model: nn.Module, path: str, *args: Any, strict: Optional[bool] = None,
                   map_location: Any = None) -> None:
        """A file or sharded directory from `save_model`; third argument ``map_location`` or ``strict``."""
        strict, map_location = checkpoint.load_form(args, strict, map_location)
        self.backends.files(model=model).load_model(path, strict=strict, map_location=map_location)

    def save_optimizer(self, optimizer: torch.optim.Optimizer, path: str, only_rank0: bool = False,
                       **kwargs: Any) -> None:
        """Every rank writes the complete state to its ``path`` (``only_rank0``: rank 0 only)."""
        shard, every_rank = checkpoint.optimizer_save_form(only_rank0, kwargs)
        self.backends.files(optimizer=optimizer).save_optimizer(path, shard=shard, every_rank=every_rank, **kwargs)

    def load_optimizer(self, optimizer: torch.optim.Optimizer, path: str, map_location: Any = None) -> None:
        """Loads this rank's file (or a sharded directory) written by `save_optimizer`."""
        self.backends.files(optimizer=optimizer).load_optimizer(path, map_location)

    def save_pretrained(self, model: nn.Module, path: str, only_rank0: bool = True, tokenizer: Any = None) -> None:
        """``save_pretrained`` of the unwrapped (Hugging Face) model and of the tokenizer; refused under Gemini, as the
        legacy stage-3 strategy refused it (its parameters are chunks: `save_model` gathers them)."""
        backend = self.backends.find(model)
        if backend is not None and backend.shards_parameters:
            raise RuntimeError("ColossalAI strategy with stage-3 does not support save_pretrained() now: "
                               + refusal("save_pretrained", backend.name))
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

    def _data_parallel(self) -> Tuple[int, int]:  # (world size, rank) of the group this strategy trains in
        return (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)

    def setup_dataloader(self, replay_buffer: Any, pin_memory: bool = False) -> DataLoader:
        """A ``DataLoader`` over a legacy replay buffer, each rank its share (`buffer_dataloader`)."""
        world_size, rank = self._data_parallel()
        return buffer_dataloader(replay_buffer, world_size, rank, self.seed, pin_memory)


@deprecated_api("coati.trainer.strategies.NaiveStrategy")
class NaiveStrategy(Strategy):
    """No wrapping; joins a process group only where the environment describes one."""

    def __init__(self) -> None:
        super().__init__(plugin=None)

    def setup_distributed(self) -> None:
        init_process_group_from_env(DIST_TIMEOUT_S, required=False)

    def _data_parallel(self) -> Tuple[int, int]:
        return 1, 0  # wraps nothing: every process trains on all of its own data


@deprecated_api("coati.trainer.strategies.DDPStrategy")
class DDPStrategy(Strategy):
    """Torch DDP through the engine's ``"ddp"`` plugin."""

    def __init__(self, seed: int = 42) -> None:
        super().__init__(plugin=legacy_options("DDPStrategy", {})[0], seed=seed)

    def setup_sampler(self, dataset: Any) -> DistributedSampler:
        return DistributedSampler(dataset, dist.get_world_size(), dist.get_rank())


class _ColossalStrategy(DDPStrategy):
    """LowLevelZero and Gemini (ddp after a CPU fallback); ``options`` from `tables.legacy_options`."""

    def __init__(self, plugin: str, options: Dict[str, Any], seed: int) -> None:
        Strategy.__init__(self, plugin=plugin, plugin_options=plugin_settings(plugin, options), seed=seed,
                          loss_scale={k: options[k] for k in LOSS_SCALE_KEYS})


@deprecated_api("coati.trainer.strategies.LowLevelZeroStrategy")
class LowLevelZeroStrategy(_ColossalStrategy):
    """ZeRO stage 1/2 through the engine's ``"zero2"`` plugin (``placement_policy="cpu"``: CPU offload)."""

    def __init__(self, stage: int = 2, precision: str = "fp16", seed: int = 42, placement_policy: str = "cuda",
                 reduce_bucket_size: int = 12 * 1024 ** 2, overlap_communication: bool = True,
                 initial_scale: float = 2 ** 16, growth_factor: float = 2, backoff_factor: float = 0.5,
                 growth_interval: int = 1000, hysteresis: int = 2, min_scale: float = 1, max_scale: float = 2 ** 32,
                 max_norm: float = 0.0, norm_type: float = 2.0) -> None:
        super().__init__(*legacy_options("LowLevelZeroStrategy", _keywords(locals())), seed)


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
        super().__init__(*legacy_options("GeminiStrategy", _keywords(locals())), seed)


@deprecated_api("coati.trainer.strategies.ColossalAIStrategy")
class ColossalAIStrategy(_ColossalStrategy):
    """The 2023 strategy: ``stage=3`` is Gemini (fp16), 1-2 LowLevelZero; ``placement_policy="cpu"`` offloads."""

    def __init__(self, stage: int = 3, precision: str = "fp16", seed: int = 42, shard_init: bool = False,
                 placement_policy: str = "cuda", pin_memory: bool = True, force_outputs_fp32: bool = False,
                 search_range_mb: int = 32, hidden_dim: Optional[int] = None, min_chunk_size_mb: float = 32,
                 gpu_margin_mem_ratio: float = 0.0, reduce_bucket_size: int = 12 * 1024 ** 2,
                 overlap_communication: bool = True, initial_scale: float = 2 ** 16, growth_factor: float = 2,
                 backoff_factor: float = 0.5, growth_interval: int = 1000, hysteresis: int = 2, min_scale: float = 1,
                 max_scale: float = 2 ** 32, max_norm: float = 0.0, norm_type: float = 2.0) -> None:
        self.stage = stage
        super().__init__(*legacy_options("ColossalAIStrategy", _keywords(locals())), seed)
