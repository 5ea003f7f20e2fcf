"""The table of ColossalAI Booster plugins a consumer can train with, and the up-front validation of a choice.

`resolve_plugin` is pure (it never imports colossalai), so the driver can reject a bad configuration before any
actor starts. `build_plugin` makes the plugin instance inside the consumer, after the process group exists.

On a host without CUDA, ColossalAI 0.5 trains with ``ddp`` (TorchDDPPlugin) and with ``hybrid``
(HybridParallelPlugin) at ``tp_size = pp_size = 1``, ``zero_stage = 0`` and ``precision = "fp32"``; LowLevelZero
and Gemini need CUDA. ``ddp`` takes one option of the engine's own, ``precision``: ``"fp32"`` (the default), or
``"bf16"``: float32 weights, gradients and optimizer state, with the trained models' forwards under bfloat16
autocast (`autocast_dtype`), on any device; what ColossalChat's default ``precision="bf16"`` trains with here.

Model parallelism is refused on every host (`MODEL_PARALLEL_OPTIONS`): the consumer runs a plain forward on the
whole model and each rank trains on rollouts of its own, so it has no pipeline schedule (pp), no vocabulary-parallel
log-probs and no identical inputs across a tensor-parallel group (tp), no sequence split (sp) and no expert groups
(ep). Consumers are data-parallel only; ZeRO (``zero2``, ``gemini``, ``hybrid`` with ``zero_stage``) shards the
optimizer state, gradients and (Gemini) the parameters instead.
"""
from __future__ import annotations

import importlib
import logging
import warnings
from typing import Any, Callable, Dict, Iterable, NamedTuple, Optional, Set, Tuple

logger = logging.getLogger(__name__)


class PluginEntry(NamedTuple):
    """factory: builds the plugin from keyword options (imports colossalai when called)."""

    factory: Callable[..., Any]
    needs_cuda: bool
    defaults: Dict[str, Any]


def _lazy(class_name: str, engine_options: Optional[Dict[str, Any]] = None) -> Callable[..., Any]:
    """The factory of colossalai's ``class_name``, with ``engine_options`` under the given ones."""
    def factory(**options: Any) -> Any:
        module = importlib.import_module("colossalai.booster.plugin")
        return getattr(module, class_name)(**{**(engine_options or {}), **options})

    factory.__name__ = class_name
    factory.__qualname__ = class_name
    return factory


PLUGINS: Dict[str, PluginEntry] = {
    # DDP's gradients are views into its all-reduce buckets: one copy of them, not two (4 bytes a parameter less,
    # measured on a 226M-parameter Qwen2 after two steps: 5,252 -> 4,327 MiB RSS); the same values
    "ddp": PluginEntry(_lazy("TorchDDPPlugin", {"gradient_as_bucket_view": True}), False, {}),
    "zero2": PluginEntry(_lazy("LowLevelZeroPlugin"), True, {"stage": 2, "precision": "bf16"}),
    "gemini": PluginEntry(_lazy("GeminiPlugin"), True, {"precision": "bf16"}),
    "hybrid": PluginEntry(_lazy("HybridParallelPlugin"), False,
                          {"tp_size": 1, "pp_size": 1, "zero_stage": 0, "precision": "fp32"}),
}

# Keyword arguments each plugin's constructor accepts in colossalai 0.5 (a test checks them against the real ones).
PLUGIN_OPTIONS: Dict[str, Set[str]] = {
    "ddp": {"broadcast_buffers", "bucket_cap_mb", "find_unused_parameters", "check_reduction",
            "gradient_as_bucket_view", "static_graph", "fp8_communication"},
    "zero2": {"stage", "precision", "initial_scale", "min_scale", "growth_factor", "backoff_factor",
              "growth_interval", "hysteresis", "max_scale", "max_norm", "norm_type", "reduce_bucket_size_in_m",
              "communication_dtype", "overlap_communication", "overlap_allgather", "cpu_offload", "master_weights",
              "verbose", "cast_inputs", "fp8_communication", "use_fp8", "extra_dp_size"},
    "gemini": {"chunk_config_dict", "chunk_init_device", "placement_policy", "enable_gradient_accumulation",
               "max_prefetch", "shard_param_frac", "offload_optim_frac", "offload_param_frac",
               "warmup_non_model_data_ratio", "steady_cuda_cap_ratio", "precision", "master_weights", "pin_memory",
               "force_outputs_fp32", "strict_ddp_mode", "search_range_m", "hidden_dim", "min_chunk_size_m",
               "memstats", "gpu_margin_mem_ratio", "initial_scale", "min_scale", "growth_factor", "backoff_factor",
               "growth_interval", "hysteresis", "max_scale", "max_norm", "norm_type", "tp_size", "extra_dp_size",
               "enable_all_optimization", "enable_fused_normalization", "enable_flash_attention",
               "enable_sequence_parallelism", "enable_jit_fused", "enable_async_reduce", "use_fp8", "verbose",
               "fp8_communication"},
    "hybrid": {"tp_size", "pp_size", "sp_size", "precision", "zero_stage", "enable_all_optimization",
               "enable_fused_normalization", "enable_flash_attention", "enable_jit_fused",
               "enable_sequence_parallelism", "sequence_parallelism_mode", "parallel_output", "num_microbatches",
               "microbatch_size", "initial_scale", "min_scale", "growth_factor", "backoff_factor",
               "growth_interval", "hysteresis", "max_scale", "max_norm", "broadcast_buffers", "ddp_bucket_cap_mb",
               "find_unused_parameters", "check_reduction", "gradient_as_bucket_view", "static_graph",
               "zero_bucket_size_in_m", "cpu_offload", "communication_dtype", "overlap_communication",
               "custom_policy", "pp_style", "num_model_chunks", "scheduler_nodes", "num_layers_per_stage",
               "gradient_checkpoint_config", "enable_metadata_cache", "make_vocab_size_divisible_by", "dp_outside",
               "overlap_p2p", "overlap_allgather", "fp8_communication", "use_fp8", "inner_ring_size"},
}

# Options the engine reads itself and does not pass to the plugin's constructor (`build_plugin` drops them).
ENGINE_OPTIONS: Dict[str, Set[str]] = {"ddp": {"precision"}}

# Plugin options that would split the model over ranks, and why a consumer cannot run them.
MODEL_PARALLEL_OPTIONS: Dict[str, str] = {
    "tp_size": "tensor parallelism needs the same rollouts on every rank of a tensor-parallel group and log-probs "
               "over a vocabulary split across ranks; each consumer rank trains on rollouts of its own with a plain "
               "forward",
    "pp_size": "pipeline parallelism needs a pipeline schedule (booster.execute_pipeline); the consumer's forward is "
               "a plain call on the whole model",
    "sp_size": "sequence parallelism splits each sequence across ranks; the consumer's log-probs need whole "
               "sequences",
    "ep_size": "expert parallelism needs the MoE plugin and expert groups, which the consumer does not build",
}
_DATA_PARALLEL_TEXT = ("train data-parallel instead: more consumer processes (num_consumer_procs), and ZeRO to shard "
                       "memory (plugin 'zero2', 'gemini', or 'hybrid' with zero_stage 1 or 2)")

_PRECISIONS = {"ddp": {"fp32", "bf16"}, "zero2": {"fp16", "bf16", "fp32"}, "gemini": {"fp16", "bf16"},
               "hybrid": {"fp16", "bf16", "fp32"}}
_CPU_PLUGINS_TEXT = "'ddp', or 'hybrid' with tp_size=1, pp_size=1, zero_stage=0, precision='fp32'"
_HYBRID_CPU = {"zero_stage": 0, "precision": "fp32"}
_FALLBACK_WARNED: Set[str] = set()


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_positive_int(name: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"plugin {name!r}: option {key} must be a positive int, got {value!r}")


def _check_data_parallel(name: str, options: Dict[str, Any]) -> None:
    """Raises ValueError on an option that would split the model over ranks (see `MODEL_PARALLEL_OPTIONS`)."""
    for key, why in MODEL_PARALLEL_OPTIONS.items():
        value = options.get(key)
        if value is not None:
            _check_positive_int(name, key, value)
            if value > 1:
                raise ValueError(f"plugin {name!r}: {key}={value} is not implemented by the engine: {why}. Use "
                                 f"{key}=1 and {_DATA_PARALLEL_TEXT}")
    if options.get("enable_sequence_parallelism"):
        raise ValueError(f"plugin {name!r}: enable_sequence_parallelism is not implemented by the engine: "
                         f"{MODEL_PARALLEL_OPTIONS['sp_size']}. Remove it and {_DATA_PARALLEL_TEXT}")


def _check_values(name: str, options: Dict[str, Any], cuda: bool) -> None:
    """Raises ValueError on option values the plugin would reject, or that need CUDA on a host without it."""
    for key in ("num_microbatches", "microbatch_size"):
        if options.get(key) is not None:
            _check_positive_int(name, key, options[key])
    if "precision" in options and name in _PRECISIONS and options["precision"] not in _PRECISIONS[name]:
        raise ValueError(f"plugin {name!r}: precision must be one of {sorted(_PRECISIONS[name])}, "
                         f"got {options['precision']!r}")
    if name == "zero2" and options.get("stage") not in (1, 2):
        raise ValueError(f"plugin 'zero2': stage must be 1 or 2, got {options.get('stage')!r}")
    if name == "hybrid":
        if options.get("zero_stage") not in (0, 1, 2):
            raise ValueError(f"plugin 'hybrid': zero_stage must be 0, 1 or 2, got {options.get('zero_stage')!r}")
        if options["zero_stage"] > 0 and options.get("precision") == "fp32":
            raise ValueError("plugin 'hybrid': zero_stage > 0 needs precision 'fp16' or 'bf16'")
        if not cuda:
            wrong = {k: options.get(k) for k, ok in _HYBRID_CPU.items() if options.get(k) != ok}
            if wrong:
                raise ValueError(f"plugin 'hybrid' without CUDA supports only zero_stage=0, precision='fp32'; got "
                                 f"{wrong}. Use a CUDA host for these, or change the options")
    if not cuda and options.get("fp8_communication"):
        raise ValueError(f"plugin {name!r}: fp8_communication needs CUDA; remove it on this host")


def resolve_plugin(name: str, options: Optional[Dict[str, Any]] = None, allow_cpu_fallback: bool = False,
                   cuda_available: Optional[bool] = None) -> Tuple[str, Dict[str, Any]]:
    """Validates a plugin choice and returns ``(name_used, options_used)`` (the defaults merged with ``options``).

    A CUDA-only plugin on a host without CUDA is an error, unless ``allow_cpu_fallback``: then ``ddp`` is used
    instead, with one warning per plugin name and process. Model parallelism (``tp_size``, ``pp_size``,
    ``sp_size``, ``ep_size`` > 1) is an error on every host. Never imports colossalai.
    """
    if not isinstance(name, str) or name not in PLUGINS:
        raise ValueError(f"unknown plugin {name!r}; choose one of {sorted(PLUGINS)}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"plugin options must be a dict or None, got {type(options).__name__}")
    options = dict(options or {})
    _check_data_parallel(name, options)
    accepted = PLUGIN_OPTIONS[name] | ENGINE_OPTIONS.get(name, set())
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(f"plugin {name!r} has no options {unknown}; accepted: {sorted(accepted)}")
    cuda = _cuda_available() if cuda_available is None else bool(cuda_available)
    entry = PLUGINS[name]
    if entry.needs_cuda and not cuda:
        if not allow_cpu_fallback:
            raise ValueError(f"plugin {name!r} needs CUDA, which this host lacks; plugins that work here: "
                             f"{_CPU_PLUGINS_TEXT} (or allow the CPU fallback to use 'ddp')")
        if name not in _FALLBACK_WARNED:
            _FALLBACK_WARNED.add(name)
            dropped = f"; its options {sorted(options)} are ignored" if options else ""
            warnings.warn(f"plugin {name!r} needs CUDA, which this host lacks: training with 'ddp' "
                          f"(TorchDDPPlugin) instead{dropped}", RuntimeWarning, stacklevel=2)
        logger.info("plugin %r replaced by 'ddp' on a host without CUDA", name)
        return "ddp", dict(PLUGINS["ddp"].defaults)
    merged = {**entry.defaults, **options}
    _check_values(name, merged, cuda)
    return name, merged


# ColossalChat's consumer (coati/distributed/consumer.py, BaseConsumer.setup at 4f9953be3) builds
# HybridParallelPlugin(**{**COLOSSALCHAT_PLUGIN_DEFAULTS, **plugin_config}).
COLOSSALCHAT_PLUGIN_DEFAULTS: Dict[str, Any] = {"tp_size": 1, "pp_size": 1, "precision": "bf16", "zero_stage": 2}
# Options that only shape model parallelism (pipeline schedule, sequence split); they go with tp/pp/sp.
_MODEL_PARALLEL_ONLY = ("microbatch_size", "num_microbatches", "pp_style", "num_model_chunks", "scheduler_nodes",
                        "num_layers_per_stage", "overlap_p2p", "enable_sequence_parallelism",
                        "sequence_parallelism_mode", "inner_ring_size", "parallel_output", "dp_outside",
                        "enable_metadata_cache")


class ColossalChatPlugin(NamedTuple):
    """What a ColossalChat ``plugin_config`` (no ``'plugin'`` key) trains with here: the plugin ``name`` and its
    ``options``, the number of data-parallel consumer processes (``num_consumer_procs / (tp*pp*sp)``, as
    ColossalChat's ``get_dp_size_fast``), and the differences from ColossalChat's run (empty: none)."""

    name: str
    options: Dict[str, Any]
    data_parallel: int
    differences: Tuple[str, ...]


def resolve_colossalchat(plugin_config: Dict[str, Any], num_consumer_procs: int,
                         cuda_available: Optional[bool] = None) -> ColossalChatPlugin:
    """ColossalChat's meaning of ``plugin_config``: ``HybridParallelPlugin`` with `COLOSSALCHAT_PLUGIN_DEFAULTS`
    updated by the given options. With CUDA that is the plugin used. Model parallelism (tp, pp, sp > 1) is not in
    this engine on any host: the same data-parallel size trains instead, each consumer holding the whole model.
    Without CUDA (no ZeRO, no fp8, no mixed precision with low-precision weights): TorchDDPPlugin, under bf16
    autocast where the precision is ``"bf16"`` (the default; `autocast_dtype`), else in fp32. Each difference is a
    sentence in ``differences`` for the driver's one warning. Raises ValueError on an option HybridParallelPlugin
    does not take or a value it rejects (as ColossalChat's consumer would fail)."""
    if not isinstance(plugin_config, dict):
        raise TypeError(f"plugin_config must be a dict, got {type(plugin_config).__name__}")
    unknown = sorted(set(plugin_config) - PLUGIN_OPTIONS["hybrid"])
    if unknown:
        raise ValueError(f"HybridParallelPlugin (ColossalChat's consumer plugin) has no options {unknown}; accepted: "
                         f"{sorted(PLUGIN_OPTIONS['hybrid'])} (or name another plugin with plugin_config['plugin'])")
    merged = {**COLOSSALCHAT_PLUGIN_DEFAULTS, **plugin_config}
    sizes = {k: merged.get(k, 1) for k in ("tp_size", "pp_size", "sp_size")}
    for key, value in sizes.items():
        _check_positive_int("hybrid", key, value)
    split = sizes["tp_size"] * sizes["pp_size"] * sizes["sp_size"]
    if num_consumer_procs % split:
        raise ValueError(f"num_consumer_procs={num_consumer_procs} must be a multiple of tp_size*pp_size*sp_size="
                         f"{split} (HybridParallelPlugin's data-parallel size is their quotient)")
    differences = []
    data_parallel = num_consumer_procs // split
    if split > 1:
        shown = ", ".join(f"{k}={v}" for k, v in sizes.items() if v > 1)
        differences.append(f"{shown}: this engine has no model parallelism, so {data_parallel} data-parallel "
                           f"consumer(s) train the whole model each instead of {num_consumer_procs} processes "
                           f"(the same data-parallel size, batches and optimizer steps as ColossalChat's)")
        merged.update(tp_size=1, pp_size=1)
        merged.pop("sp_size", None)
        for key in _MODEL_PARALLEL_ONLY:
            merged.pop(key, None)
    else:  # microbatch sizes only shape a pipeline schedule (pp_size > 1)
        merged.pop("microbatch_size", None)
        merged.pop("num_microbatches", None)
    cuda = _cuda_available() if cuda_available is None else bool(cuda_available)
    if cuda:
        _check_values("hybrid", merged, cuda=True)
        return ColossalChatPlugin("hybrid", merged, data_parallel, tuple(differences))
    _check_values("hybrid", merged, cuda=True)  # values HybridParallelPlugin would reject anywhere
    needs_cuda = {k: merged[k] for k in ("precision", "zero_stage", "fp8_communication", "use_fp8", "cpu_offload")
                  if k in merged and merged[k] not in (None, False, 0, "fp32")}
    others = sorted(k for k in set(merged) - set(needs_cuda) - {"tp_size", "pp_size", "precision", "zero_stage"}
                    if merged[k] not in (None, False))
    options = {"precision": "bf16"} if merged.get("precision") == "bf16" else {}
    if needs_cuda or others:
        what = ", ".join(f"{k}={v!r}" for k, v in needs_cuda.items())
        text = (f"HybridParallelPlugin({what}) needs CUDA, which this host lacks" if what else
                "this host has no CUDA")
        how = ("float32 weights and optimizer state, forwards under bf16 autocast (ColossalChat: bf16 weights, "
               "float32 masters)" if options else "in fp32")
        dropped = f"; its options {others} have no effect there" if others else ""
        differences.append(f"{text}: training with TorchDDPPlugin, {how}, instead{dropped}")
    return ColossalChatPlugin("ddp", options, data_parallel, tuple(differences))


def plugin_for_plain_module(name: str, options: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """The plugin for a model that is not a transformers model (PPO's critic, an extension) beside a policy trained
    with ``(name, options)``: HybridParallelPlugin shards transformers models only, so at tp = pp = 1 its ZeRO
    stage and precision go to LowLevelZero ('zero2'), or to 'ddp' without ZeRO; other plugins as they are."""
    if name != "hybrid":
        return name, dict(options)
    if options.get("zero_stage", 0) > 0:
        return "zero2", {"stage": options["zero_stage"], "precision": options.get("precision", "bf16")}
    return "ddp", {}


PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def precision_dtype(name: str, options: Optional[Dict[str, Any]] = None) -> str:
    """The dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``) of the weights that plugin ``name`` computes
    its forward with: ``ddp`` trains the model as it is (float32; its ``precision="bf16"`` autocasts the forward,
    `autocast_dtype`), the others in their ``precision`` (default: the table's). The reference model and the
    producers' engine follow it, so that their log-probs match the policy's at the first step."""
    if name not in PLUGINS:
        raise ValueError(f"unknown plugin {name!r}; choose one of {sorted(PLUGINS)}")
    if name == "ddp":
        return "float32"
    precision = {**PLUGINS[name].defaults, **(options or {})}.get("precision", "fp32")
    if precision not in PRECISION_DTYPES:
        raise ValueError(f"plugin {name!r}: precision must be one of {sorted(PRECISION_DTYPES)}, got {precision!r}")
    return PRECISION_DTYPES[precision]


def autocast_dtype(name: Optional[str], options: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """The dtype name that the forwards of a model trained with plugin ``name`` run under ``torch.autocast`` in, or
    None (no autocast): ``"bfloat16"`` for ``ddp`` with ``precision="bf16"``. Matmuls and convolutions then compute
    in bf16 (AMX or AVX-512 BF16 on a CPU that has them) from float32 weights; reductions, norms and softmaxes stay
    float32, as torch's autocast lists them."""
    if name == "ddp" and (options or {}).get("precision") == "bf16":
        return "bfloat16"
    return None


def optimizer_kind(name: str, options: Dict[str, Any], cuda: bool) -> str:
    """The optimizer a `TrainingBackend` with plugin ``name`` makes: ``"hybrid_adam"`` (ColossalAI's) on CUDA where
    the plugin needs it (Gemini takes only ColossalAI's Adam optimizers) or keeps the optimizer state on the CPU
    (``cpu_offload``, Gemini's ``offload_optim_frac``), else ``"fused_adamw"``: torch's fused kernel, on the GPU or
    the CPU. On the CPU it steps without temporaries of a parameter's size (the unfused step makes two for
    ``sqrt(v) / c``: 1.1 GB at a 152k x 896 embedding, the optimizer step's peak on a 494M model) and in 0.15-0.4x
    the time. HybridAdam's two kernels are built on first use (``fused_optim_cuda`` about 60 s, ``cpu_adam_x86``
    31 s in a fresh environment; `make setup-gpu` builds both ahead, `training.kernels`); the fused AdamW needs no
    build."""
    if cuda and (name == "gemini" or options.get("cpu_offload") or options.get("offload_optim_frac", 0) > 0):
        return "hybrid_adam"
    return "fused_adamw"


def build_optimizer(params: Iterable[Any], lr: float, name: Optional[str], options: Dict[str, Any], cuda: bool,
                    betas: Tuple[float, float] = (0.9, 0.999), weight_decay: float = 0.0,
                    decoupled: bool = True) -> Any:
    """The optimizer of kind `optimizer_kind` over ``params``: ColossalAI's ``HybridAdam``, or torch's AdamW (its
    fused form for ``"fused_adamw"``). ``decoupled=False`` gives the Adam form instead (torch ``Adam``,
    ``HybridAdam(adamw_mode=False)``), as the legacy trainers used. ``name`` None: no plugin (torch's)."""
    import torch

    kind = optimizer_kind(name or "ddp", options, cuda)
    if kind == "hybrid_adam":
        from colossalai.nn.optimizer import HybridAdam

        return HybridAdam(params, lr=lr, betas=betas, weight_decay=weight_decay, adamw_mode=decoupled)
    torch_class = torch.optim.AdamW if decoupled else torch.optim.Adam
    return torch_class(params, lr=lr, betas=betas, weight_decay=weight_decay,
                       fused=True if kind == "fused_adamw" else None)


def with_accumulation(name: str, options: Dict[str, Any], micro_batches: int) -> Dict[str, Any]:
    """The options of plugin ``name`` for optimizer steps of ``micro_batches`` backward passes each.

    Gemini by default writes a backward pass's gradients into the chunk of the low-precision parameters
    (``reuse_fp16_chunk``): a second micro-batch would then run forward on gradients as weights, and its gradients
    would overwrite the first's. With more than one micro-batch a step, Gemini gets
    ``enable_gradient_accumulation=True``; the other plugins accumulate as they are.
    """
    if name != "gemini" or micro_batches <= 1:
        return dict(options)
    if options.get("enable_gradient_accumulation") is False:
        raise ValueError(f"plugin 'gemini': enable_gradient_accumulation=False with {micro_batches} micro-batches "
                         f"per optimizer step would train on corrupted weights; drop the option, or make "
                         f"train_microbatch_size and train_minibatch_size * num_generations cover a whole step")
    return {**options, "enable_gradient_accumulation": True}


def build_plugin(name: str, options: Optional[Dict[str, Any]] = None) -> Any:
    """A colossalai plugin instance for an already resolved ``(name, options)`` (the engine's own options,
    `ENGINE_OPTIONS`, left out); needs the process group."""
    if name not in PLUGINS:
        raise ValueError(f"unknown plugin {name!r}; choose one of {sorted(PLUGINS)}")
    own = ENGINE_OPTIONS.get(name, set())
    return PLUGINS[name].factory(**{k: v for k, v in (options or {}).items() if k not in own})
