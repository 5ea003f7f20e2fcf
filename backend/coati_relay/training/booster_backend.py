"""The `TrainingBackend` seam: a model, its optimizer and LR schedule, boosted by a ColossalAI Booster plugin.

The optimizer is torch's fused AdamW (on the CPU too), or on CUDA ColossalAI's ``HybridAdam`` where the
plugin needs it (`plugins.optimizer_kind`: Gemini, CPU offload). Where colossalai is not installed, plain torch
does the same job (DDP when the process group has more than one rank). `TrainingBackend.around`
takes a model and optimizer built elsewhere instead. Under the plugins that keep no fp32 master weights (``ddp``, no
plugin) fp16/bf16 models step fp32 masters (`coati_relay.training.master_weights`); every backward and step checks
for non-finite values (`coati_relay.training.finite_checks`); a tied input embedding gives its gradient as rows
(`coati_relay.training.tied_embedding`). Model and optimizer files: `checkpoint_files`. Under
Gemini, `coati_relay.training.gemini_guards`: tied aliases load, one backward a step unless Gemini accumulates, no
read of its parameters outside its hooks.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, ContextManager, Dict, Iterable, Optional, Tuple, Union

import torch
import torch.nn as nn
from torch.optim.lr_scheduler import LambdaLR

from coati_relay.cluster.devices import accelerator_device

from . import checkpoint_files
from .distributed import ensure_single_process_group
from .finite_checks import check_gradient_chunks, check_losses, check_overflow_skip, check_weights
from .float32_attention import use_float32_attention
from .gemini_guards import GEMINI, AliasLoad, GeminiStepGuard
from .master_weights import find_master_optimizer, with_master_weights
from .model_description import is_peft, save_description
from .plugins import autocast_dtype, build_optimizer, build_plugin, resolve_plugin
from .schedule import WarmupSchedule, check_args
from .tied_embedding import sparse_tied_embedding_gradient

logger = logging.getLogger(__name__)

LORA_KEYS = ("r", "alpha", "target_modules", "dropout")  # train_model_config['lora']: 'r' required

MODEL_FILE, OPTIMIZER_FILE, SCHEDULER_FILE = "model.pt", "optimizer.pt", "lr_scheduler.pt"
BOOST_EXTRAS = ("criterion", "dataloader", "lr_scheduler")


def load_causal_lm(path: Union[str, os.PathLike], dtype: torch.dtype = torch.float32,
                   lora: Optional[Dict[str, Any]] = None, gradient_checkpointing: bool = False,
                   **from_pretrained: Any) -> nn.Module:
    """``AutoModelForCausalLM`` from a local directory, in ``dtype`` (float32 to train).

    lora: ``{"r": 8, "alpha": 16, "target_modules": [...], "dropout": 0.0}`` wraps the model with peft LoRA, so
    that only the adapters train (``target_modules`` None: peft's default for the architecture).
    gradient_checkpointing: training forwards keep only each decoder layer's input and recompute the layer in the
    backward (transformers' non-reentrant checkpointing): activations of one layer instead of all, for about one more
    forward per step. Generation (eval mode) is unchanged.
    from_pretrained: further keywords of ``from_pretrained`` (train_model_config's, `config_models`); a ``dtype``
    there replaces ``dtype``.
    """
    from transformers import AutoModelForCausalLM

    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"load_causal_lm: {path} holds no config.json; pass a local model directory "
                         "(nothing is downloaded)")
    model = AutoModelForCausalLM.from_pretrained(path, **{"dtype": dtype, **from_pretrained})
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora is None:
        return model
    if not isinstance(lora, dict) or set(lora) - set(LORA_KEYS) or "r" not in lora:
        raise ValueError(f"load_causal_lm: lora must be a dict with 'r' and optionally {list(LORA_KEYS[1:])}, "
                         f"got {lora!r}")
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=int(lora["r"]), lora_alpha=lora.get("alpha", 2 * int(lora["r"])),
                        target_modules=lora.get("target_modules"), lora_dropout=lora.get("dropout", 0.0),
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def unwrap_boosted(model: nn.Module) -> nn.Module:
    """The module inside a plugin's wrapper (TorchDDPModel, LowLevelZeroModel, GeminiDDP; a peft model stays one)
    or inside torch's ``DistributedDataParallel``; else ``model``."""
    if "colossalai.interface" in sys.modules:  # nothing is wrapped by colossalai before it is imported
        from colossalai.interface import ModelWrapper

        if isinstance(model, ModelWrapper):
            return model.unwrap(unwrap_peft=False)
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _colossalai_installed() -> bool:
    return importlib.util.find_spec("colossalai") is not None


def _is_transformers_model(module: nn.Module) -> bool:
    from transformers import PreTrainedModel

    base = module.get_base_model() if is_peft(module) else module
    return isinstance(base, PreTrainedModel)


def _merged_lora_state_dict(peft_model: nn.Module) -> Dict[str, torch.Tensor]:
    """HF-named weights of a peft LoRA model with every adapter folded in: W = W_base + scale * B @ A."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    out = {k: v for k, v in base.state_dict().items() if ".lora_" not in k}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            key = f"{name}.base_layer.weight"
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            out[key] = out[key] + delta
    return {k.replace(".base_layer.", "."): v for k, v in out.items()}


class TrainingBackend:
    """A boosted model and optimizer. One instance per model per consumer process.

    Usage per optimizer step: ``backend.backward(loss)`` (any number of times; under Gemini more than once only with
    ``enable_gradient_accumulation``), ``stats = backend.step()``, ``backend.zero_grad()``. Gradients are averaged
    over the data-parallel group by the plugin.

    scheduler: None, "constant", "cosine" or "colossalchat" (`training.schedule.WarmupSchedule`; the last counts
    ``total_steps`` and ``rounds`` in rounds of ``steps_per_round`` optimizer steps).
    name: what errors call the model ("policy", "critic"). check_finite: stop at a non-finite loss or weight
    (`coati_relay.training.finite_checks`).
    """

    def __init__(self, model: nn.Module, lr: float, plugin: str = "ddp",
                 plugin_options: Optional[Dict[str, Any]] = None, weight_decay: float = 0.0,
                 betas: Tuple[float, float] = (0.9, 0.999), max_grad_norm: Optional[float] = None,
                 scheduler: Optional[str] = None, total_steps: Optional[int] = None, warmup_steps: int = 0,
                 allow_cpu_fallback: bool = False, min_lr_ratio: float = 0.0, name: str = "model",
                 check_finite: bool = True, steps_per_round: int = 1, rounds: int = 0) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"TrainingBackend: model must be an nn.Module, got {type(model).__name__}")
        check_args(lr, weight_decay, betas, max_grad_norm, scheduler, total_steps, warmup_steps, min_lr_ratio,
                   steps_per_round)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("TrainingBackend: the model has no parameter with requires_grad=True")
        self.plugin_name, options = resolve_plugin(plugin, plugin_options, allow_cpu_fallback)
        if self.plugin_name == "hybrid" and not _is_transformers_model(model):
            raise ValueError(f"TrainingBackend: plugin 'hybrid' shards transformers models only (it has no policy "
                             f"for {type(model).__name__}); use plugin 'ddp' for this model")
        self.max_grad_norm = max_grad_norm
        if max_grad_norm is not None and self.plugin_name != "ddp":
            options.setdefault("max_norm", max_grad_norm)
        self.cuda = torch.cuda.is_available()
        ensure_single_process_group()
        self._device = accelerator_device()  # where every plugin (and the plain-torch fallback) puts the model
        optimizer = self._make_optimizer(params, lr, betas, weight_decay, options)
        schedule = None
        if scheduler is not None:
            schedule = LambdaLR(optimizer, WarmupSchedule(scheduler, warmup_steps, total_steps, min_lr_ratio,
                                                          steps_per_round, rounds))
        self._wrap(model, optimizer, options, name, check_finite, schedule=schedule)
        logger.info("TrainingBackend: plugin %s %s, %d trainable tensors, optimizer %s", self.plugin_name, options,
                    len(params), type(optimizer).__name__)

    @classmethod
    def around(cls, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
               plugin: Optional[str] = None, plugin_options: Optional[Dict[str, Any]] = None,
               allow_cpu_fallback: bool = True, loss_scale: Optional[Dict[str, Any]] = None,
               master_weights: bool = True, name: str = "model", check_finite: bool = True,
               **extras: Any) -> "TrainingBackend":
        """A backend around a model and optimizer built elsewhere, with their hyper-parameters as they are.

        plugin: a plugin of `coati_relay.training.plugins`, or None: no wrapping and no process group (plain
        ``backward`` and ``step`` on the model in place). optimizer None: the model alone is wrapped (not at all
        when it has no trainable parameter); `step` then raises. loss_scale: `DynamicLossScale` options for fp16
        masters. extras: ``criterion``, ``dataloader``, ``lr_scheduler``, boosted with the model and kept in
        ``boost_extras`` (that scheduler is the caller's to step).
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"TrainingBackend.around: model must be an nn.Module, got {type(model).__name__}")
        unknown = sorted(set(extras) - set(BOOST_EXTRAS))
        if unknown:
            raise TypeError(f"TrainingBackend.around: unknown arguments {unknown}; extras are {list(BOOST_EXTRAS)}")
        self = cls.__new__(cls)
        self.max_grad_norm = None
        self.cuda = torch.cuda.is_available()
        if plugin is None:
            self.plugin_name, options = None, {}
            self._device = next((p.device for p in model.parameters()), torch.device("cpu"))
        else:
            self.plugin_name, options = resolve_plugin(plugin, plugin_options, allow_cpu_fallback)
            ensure_single_process_group()
            self._device = accelerator_device()
        self._wrap(model, optimizer, options, name, check_finite, master_weights=master_weights,
                   loss_scale=loss_scale, extras=extras)
        return self

    def _wrap(self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer], options: Dict[str, Any],
              name: str, check_finite: bool, schedule: Optional[LambdaLR] = None, master_weights: bool = True,
              loss_scale: Optional[Dict[str, Any]] = None, extras: Optional[Dict[str, Any]] = None) -> None:
        """Boosts ``model``, ``optimizer`` (over fp32 masters where the plugin keeps none) and ``schedule`` (stepped
        by `step`) with ``extras``."""
        self.name, self.check_finite, self.steps_done = name, check_finite, 0
        self.plugin_options = options
        autocast = autocast_dtype(self.plugin_name, options)
        self.autocast = getattr(torch, autocast) if autocast else None
        self.prepare_forwards(model)
        if optimizer is not None and master_weights and not self.keeps_master_weights:
            optimizer = with_master_weights(optimizer, **(loss_scale or {}))
        extras = {k: v for k, v in (extras or {}).items() if v is not None}
        trainable = optimizer is not None or any(p.requires_grad for p in model.parameters())
        if self.plugin_name is None or not trainable:
            self.booster, self.model = None, model
            self.optimizer, self.scheduler, self.boost_extras = optimizer, schedule, extras
        elif not _colossalai_installed():
            logger.warning("colossalai is not installed: training with plain torch (DDP)")
            self.booster = None
            self.model = self._torch_wrap(model)
            self.optimizer, self.scheduler, self.boost_extras = optimizer, schedule, extras
        else:
            from colossalai.booster import Booster

            self.booster = Booster(plugin=build_plugin(self.plugin_name, options))
            boosted = self.booster.boost(model, optimizer, extras.get("criterion"), extras.get("dataloader"),
                                         schedule if schedule is not None else extras.get("lr_scheduler"))
            self.model, self.optimizer = boosted[0], boosted[1]
            self.scheduler = boosted[4] if schedule is not None else None
            self.boost_extras = {k: v for k, v in zip(BOOST_EXTRAS, boosted[2:]) if k in extras}
        if self.plugin_name in (None, "ddp"):  # the optimizer and DDP see the summed, dense gradient
            sparse_tied_embedding_gradient(unwrap_boosted(self.model))
        self.gemini_guard = None
        if self.shards_parameters:
            AliasLoad.install(self.model)
            self.gemini_guard = GeminiStepGuard(self.model, options, name)
        # Keyword arguments of a transformers causal LM reach it through the wrappers (their forward takes
        # **kwargs), but for hybrid's, whose sharded forward is its own. A prompt cache shared over two forwards
        # (`coati_relay.inference.prompt_sharing`) only under torch DDP, where the module's parameters stay in place
        # between forwards, and without gradient checkpointing.
        self.causal_lm = _is_transformers_model(model) and self.plugin_name != "hybrid"
        self.shares_prompts = self.causal_lm and (self.booster is None or self.plugin_name == "ddp") \
            and not getattr(model, "is_gradient_checkpointing", False)

    @property
    def shards_parameters(self) -> bool:
        """Whether Gemini holds the model's parameters (in chunks it may free outside its hooks: nothing reads them
        directly, see `coati_relay.training.gemini_guards`)."""
        return self.booster is not None and self.plugin_name == GEMINI

    @property
    def keeps_master_weights(self) -> bool:
        """Whether the plugin keeps fp32 master weights itself (LowLevelZero, Gemini, hybrid in fp16/bf16)."""
        if self.plugin_name == "hybrid":
            return self.plugin_options.get("precision") in ("fp16", "bf16")
        return self.plugin_name in ("zero2", "gemini")

    def _make_optimizer(self, params: Iterable[nn.Parameter], lr: float, betas: Tuple[float, float],
                        weight_decay: float, options: Dict[str, Any]) -> torch.optim.Optimizer:
        return build_optimizer(params, lr, self.plugin_name if _colossalai_installed() else "ddp", options,
                               self.cuda, betas, weight_decay)

    def _torch_wrap(self, model: nn.Module) -> nn.Module:
        import torch.distributed as dist

        model = model.to(self._device)
        if dist.get_world_size() > 1:
            return nn.parallel.DistributedDataParallel(model)
        return model

    def prepare_forwards(self, model: nn.Module) -> None:
        """Readies ``model`` (this backend's, or one whose forwards run in its `forward_precision`: the reference
        model) for that precision: under autocast on a CPU, attention in float32 (`float32_attention`)."""
        if self.autocast is not None and self._device.type == "cpu":
            use_float32_attention(model)

    def forward_precision(self) -> ContextManager:
        """The context the model's forwards run in: ``torch.autocast`` in ``self.autocast`` (``ddp`` with
        ``precision="bf16"``: `plugins.autocast_dtype`), else none. The backward runs outside it, as autocast
        wants."""
        if self.autocast is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    @property
    def device(self) -> torch.device:
        """Where the inputs of `model` must live: the accelerator where the host has one, else the CPU (see
        `coati_relay.cluster.devices`). Under Gemini, weights offloaded to the CPU still take their inputs there."""
        return self._device

    def backward(self, loss: torch.Tensor, batch: Any = None, loss_name: Optional[str] = None) -> None:
        """``loss.backward()`` through the plugin (times the fp16 loss scale under masters). Raises
        `NonFiniteTrainingError` first when ``loss`` is not finite, naming ``loss_name`` and the non-finite fields
        of ``batch`` (what the loss was computed on), when given."""
        if self.check_finite:
            check_losses(self.steps_done + 1, {loss_name or f"the {self.name} loss": loss}, batch,
                         {self.name: self.optimizer})
        if self.gemini_guard is not None:
            self.gemini_guard.before_backward()
        master = find_master_optimizer(self.optimizer)
        if master is not None:
            loss = master.scale_loss(loss)
        if self.booster is None:
            loss.backward()
        else:
            self.booster.backward(loss, self.optimizer)

    def step(self) -> Dict[str, Optional[float]]:
        """One optimizer step (after the gradient clip, when set) and one scheduler step.

        Returns ``grad_norm`` (total L2 norm before clipping; None where the plugin does not report it) and ``lr``
        (the learning rate this step used). Raises `NonFiniteTrainingError` when the step left a non-finite weight
        (under Gemini: before the step, when its gradients are not finite).
        """
        if self.optimizer is None:
            raise ValueError(f"TrainingBackend.step: the {self.name} backend holds no optimizer (it was made around "
                             "the model alone); pass an optimizer to TrainingBackend.around to train it")
        master = find_master_optimizer(self.optimizer)
        if master is not None:
            master.unscale_grads()  # the norm and the clip below see the fp32 gradients
        lr = float(self.optimizer.param_groups[0]["lr"])
        grad_norm: Optional[float] = None
        measure_here = self.booster is None or self.plugin_name == "ddp"  # the others clip and measure in step()
        if self.check_finite and self.gemini_guard is not None:
            non_finite = self.gemini_guard.non_finite_gradients()
            if non_finite is not None:
                check_gradient_chunks(self.steps_done + 1, self.name, non_finite, self.optimizer)
        if measure_here:
            params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
            if self.max_grad_norm is not None:
                grad_norm = float(nn.utils.clip_grad_norm_(params, self.max_grad_norm))
            elif params:
                grad_norm = float(nn.utils.get_total_norm([p.grad for p in params]))
        self.optimizer.step()
        if not measure_here:
            norm = self.optimizer.get_grad_norm()
            grad_norm = None if norm is None else float(norm)
        if self.scheduler is not None:
            self.scheduler.step()
        self.steps_done += 1
        if self.gemini_guard is not None:
            self.gemini_guard.stepped()
            skip = self.gemini_guard.overflow_skip(self.optimizer)
            if self.check_finite:
                check_overflow_skip(self.steps_done, self.name, skip, self.gemini_guard.skipped_in_a_row,
                                    self.optimizer)
        elif self.check_finite:
            check_weights(self.steps_done, {self.name: self.model}, {self.name: self.optimizer})
        return {"grad_norm": grad_norm, "lr": lr}

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def train(self) -> "TrainingBackend":
        self.model.train()
        return self

    def unwrapped(self) -> nn.Module:
        """The model inside the plugin's wrappers (a peft model stays a peft model)."""
        return unwrap_boosted(self.model)

    def full_state_dict(self) -> Dict[str, torch.Tensor]:
        """The complete state dict of the module inside the wrappers (no copy where it is whole on this rank). A
        collective under gemini: every rank of the data-parallel group calls it together."""
        if self.booster is not None and self.plugin_name == "gemini":
            return self.model.state_dict(only_rank_0=False)
        if hasattr(self.model, "_force_wait_all_gather"):
            self.model._force_wait_all_gather()
        return self.unwrapped().state_dict()

    def save_model(self, path: Union[str, os.PathLike], shard: bool = False, every_rank: bool = False,
                   **kwargs: Any) -> None:
        """The model's file (rank 0 writes it), its sharded directory (``shard``) or a complete file per rank
        (``every_rank``); see `coati_relay.training.checkpoint_files`. Every rank calls it."""
        holder = self.model if self.booster is not None and self.plugin_name == "gemini" else self.unwrapped()
        checkpoint_files.save_model(self.booster, self.model, holder, os.fspath(path), shard, every_rank, **kwargs)

    def load_model(self, path: Union[str, os.PathLike], strict: bool = True, map_location: Any = None) -> None:
        """Loads a file or sharded directory written by `save_model`."""
        model = self.model if self.booster is not None else self.unwrapped()
        checkpoint_files.load_model(self.booster, model, os.fspath(path), strict, map_location)

    def save_optimizer(self, path: Union[str, os.PathLike], shard: bool = False, every_rank: bool = False,
                       **kwargs: Any) -> None:
        """The optimizer's complete state: forms as in `save_model`."""
        checkpoint_files.save_optimizer(self.booster, self.optimizer, os.fspath(path), shard, every_rank, **kwargs)

    def load_optimizer(self, path: Union[str, os.PathLike], map_location: Any = None) -> None:
        """Loads a file or sharded directory written by `save_optimizer`."""
        replicated = self.booster is None or self.plugin_name not in ("zero2", "gemini")
        checkpoint_files.load_optimizer(self.booster, self.optimizer, os.fspath(path), map_location, replicated)

    def state_dict_for_inference(self, keep: bool = True, device: Optional[torch.device] = None,
                                 copy: bool = True) -> Dict[str, torch.Tensor]:
        """A copy of the full weights under the HF model's own names (LoRA adapters folded in), CPU, contiguous.
        With ``device`` (a publisher that sends from the GPU), the tensors on that device instead, copied only where
        they are elsewhere: no round trip through host memory; read them before the next optimizer step.
        ``copy=False`` (without ``device``): the tensors wherever they are, copied only where not contiguous, for a
        caller that copies them before the next optimizer step (every `WeightPublisher` does, before it returns).

        A collective under gemini (its chunks are gathered from every rank): every rank of the data-parallel group
        calls it together. ``keep=False`` takes part in that gather without copying and returns ``{}`` (the ranks
        that do not publish).
        """
        if self.plugin_name == "gemini":
            state = self.model.state_dict(only_rank_0=False)
        elif not keep:
            return {}
        else:
            if hasattr(self.model, "_force_wait_all_gather"):
                self.model._force_wait_all_gather()
            module = self.unwrapped()
            state = _merged_lora_state_dict(module) if is_peft(module) else module.state_dict()
        if not keep:
            return {}
        with torch.no_grad():
            if device is not None:
                return {k: v.detach().to(device).contiguous() for k, v in state.items()}
            if not copy:
                return {k: v.detach().contiguous() for k, v in state.items()}
            return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}

    def save(self, directory: Union[str, os.PathLike]) -> Path:
        """Writes ``model.pt``, ``optimizer.pt`` and ``lr_scheduler.pt`` (when there is a scheduler) into
        ``directory``, and for a transformers model its description (`model_description.save_description`). Every
        rank must call it; rank 0 writes."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if checkpoint_files.rank() == 0:
            save_description(self.unwrapped(), directory)
        if self.booster is None:
            if checkpoint_files.rank() == 0:
                torch.save(self.unwrapped().state_dict(), directory / MODEL_FILE)
                torch.save(self.optimizer.state_dict(), directory / OPTIMIZER_FILE)
                if self.scheduler is not None:
                    torch.save(self.scheduler.state_dict(), directory / SCHEDULER_FILE)
            return directory
        self.booster.save_model(self.model, str(directory / MODEL_FILE), shard=False)
        self.booster.save_optimizer(self.optimizer, str(directory / OPTIMIZER_FILE), shard=False)
        if self.scheduler is not None:
            self.booster.save_lr_scheduler(self.scheduler, str(directory / SCHEDULER_FILE))
        return directory

    def load(self, directory: Union[str, os.PathLike]) -> None:
        """Restores what `save` wrote: weights, optimizer state (moments, step) and the scheduler position."""
        directory = Path(directory)
        needed = [MODEL_FILE, OPTIMIZER_FILE] + ([SCHEDULER_FILE] if self.scheduler is not None else [])
        missing = [name for name in needed if not (directory / name).is_file()]
        if missing:
            raise FileNotFoundError(f"TrainingBackend.load: {directory} lacks {missing}; "
                                    "pass a directory written by TrainingBackend.save")
        if self.booster is None:
            self.unwrapped().load_state_dict(torch.load(directory / MODEL_FILE, map_location="cpu"))
            self.optimizer.load_state_dict(torch.load(directory / OPTIMIZER_FILE, map_location="cpu"))
            if self.scheduler is not None:
                self.scheduler.load_state_dict(torch.load(directory / SCHEDULER_FILE))
            return
        self.booster.load_model(self.model, str(directory / MODEL_FILE))
        self.booster.load_optimizer(self.optimizer, str(directory / OPTIMIZER_FILE))
        if self.scheduler is not None:
            self.booster.load_lr_scheduler(self.scheduler, str(directory / SCHEDULER_FILE))
