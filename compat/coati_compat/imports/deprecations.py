"""The deprecation table of the legacy surface, and the helpers that warn from it.

One table, ``DEPRECATIONS``, maps every legacy dotted name to what serves it and what replaces it:

- a module entry (``coati.ray.utils``) has a target module (``coati_compat.legacy.ray_utils``); the import finder
  serves exactly these paths, as the very same module objects, and warns at the user's import line;
- a name entry (``coati.ray.utils.get_actor_from_args``) has a target ``module:attribute``; the object is decorated
  with ``deprecated_api(name)``, which warns when user code calls it, instantiates it or subclasses it, and sets
  ``__deprecated__``. Type checkers see ``typing_extensions.deprecated`` in its place (PEP 702).

Warnings are ``FutureWarning`` (shown by default), raised at the user's own frame through ``warnings.warn_explicit``
with that frame's ``__warningregistry__``: under the default filter each call site warns once.

This module is imported by the finder in every interpreter: it must not import torch (or anything heavy).
"""
from __future__ import annotations

import functools
import os
import sys
import warnings
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Dict, NamedTuple, Optional, TypeVar

REMOVAL_VERSION = "0.3.0"
GUIDE = "migration_guide/api_map.md"

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # coati_compat/
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(__import__("importlib").__file__)) + os.sep


class Deprecation(NamedTuple):
    """target: ``package.module`` (module entry) or ``package.module:attribute`` (name entry)."""

    target: str
    replacement: str
    removal: str
    anchor: str

    @property
    def is_module(self) -> bool:
        return ":" not in self.target


def _slug(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum() or c in "-_")


def _module(target: str, replacement: str, legacy: str) -> Deprecation:
    return Deprecation(target, replacement, REMOVAL_VERSION, f"{GUIDE}#{_slug(legacy)}")


def _build_table() -> Dict[str, Deprecation]:
    table: Dict[str, Deprecation] = {}

    def modules(target: str, replacement: str, *legacy_paths: str) -> None:
        for path in legacy_paths:
            table[path] = _module(target, replacement, path)

    def names(legacy_module: str, target: str, replacements: Dict[str, str]) -> None:
        for name, replacement in replacements.items():
            table[f"{legacy_module}.{name}"] = Deprecation(
                f"{target}:{name}", replacement, REMOVAL_VERSION, f"{GUIDE}#{_slug(name)}")

    launch = "coati_relay.launch_distributed(...)"
    hf_models = "a Hugging Face checkpoint path in the model configs of " + launch
    plugins = "plugin_config of " + launch + " (plugins 'ddp', 'zero2', 'gemini', 'hybrid')"
    queue = "the engine's rollout queue, which " + launch + " sets up (coati_relay.exchange.queue)"

    # coati.ray: the Ray roles (served by coati_compat.shims) and their helpers.
    modules("coati_compat.shims.trainer_base", "a consumer started by " + launch, "coati.ray.detached_trainer_base")
    modules("coati_compat.shims.ppo_trainer", launch + " with core_algo='PPO'", "coati.ray.detached_trainer_ppo")
    modules("coati_compat.shims.replay_buffer", queue,
            "coati.ray.detached_replay_buffer")
    modules("coati_compat.shims.maker_holder", "a producer started by " + launch, "coati.ray.experience_maker_holder")
    names("coati.ray.detached_trainer_base", "coati_compat.shims.trainer_base",
          {"DetachedTrainer": "a consumer started by " + launch})
    names("coati.ray.detached_trainer_ppo", "coati_compat.shims.ppo_trainer",
          {"DetachedPPOTrainer": launch + " with core_algo='PPO'"})
    names("coati.ray.detached_replay_buffer", "coati_compat.shims.replay_buffer",
          {"DetachedReplayBuffer": queue})
    names("coati.ray.experience_maker_holder", "coati_compat.shims.maker_holder",
          {"ExperienceMakerHolder": "a producer started by " + launch})

    modules("coati_compat.legacy.ray_utils", "the arguments of " + launch, "coati.ray.utils")
    names("coati.ray.utils", "coati_compat.legacy.ray_utils", {
        "is_rank_0": "torch.distributed.get_rank() == 0",
        "get_rank": "torch.distributed.get_rank()",
        "get_world_size": "torch.distributed.get_world_size()",
        "get_actor_from_args": hf_models,
        "get_critic_from_args": hf_models,
        "get_reward_model_from_args": hf_models,
        "get_strategy_from_args": plugins,
        "get_tokenizer_from_args": "transformers.AutoTokenizer.from_pretrained(<local path>)",
        "set_dist_env": launch + ", which sets up the process groups itself",
        "get_model_numel": "sum(p.numel() for p in model.parameters())",
        "get_grad_required_state_dict": "coati_relay.exchange.weight_sync",
        "get_receivers_per_sender": "the engine's rollout queue, which every consumer reads (no routing to compute)",
        "state_dict_to": "coati_relay.exchange.weight_sync, which keeps each tensor's dtype",
    })
    hooks = ("hooks: " + launch.replace("(...)", "(callbacks=[...])") + " (coati_compat.legacy_hooks.LegacyHook "
             "runs a legacy callback as one)")
    modules("coati_compat.legacy.callbacks", hooks,
            "coati.ray.callbacks", "coati.ray.callbacks.base", "coati.ray.callbacks.performance_evaluator")
    names("coati.ray.callbacks", "coati_compat.legacy.callbacks", {
        "TrainerCallback": hooks,
        "MakerCallback": hooks,
        "TrainerPerformanceEvaluator": "the throughput metrics returned by " + launch,
        "ExperienceMakerPerformanceEvaluator": "the throughput metrics returned by " + launch,
    })
    modules("coati_compat.legacy.lora", "LoRA adapters published by coati_relay.exchange.weight_sync",
            "coati.ray.lora_constructor", "coati.models.lora")
    names("coati.ray.lora_constructor", "coati_compat.legacy.lora", {
        "LoRAConstructor": "LoRA adapters published by coati_relay.exchange.weight_sync",
        "LoRAConfig": "peft.LoraConfig",
    })
    names("coati.models.lora", "coati_compat.legacy.lora", {
        "LoraLinear": "peft LoRA layers",
        "LoRAModule": "peft.get_peft_model(model, peft.LoraConfig(...))",
        "convert_to_lora_module": "peft.get_peft_model(model, peft.LoraConfig(...))",
    })

    # coati.experience_maker and coati.experience_buffer.utils: the data types and the experience step.
    modules("coati_compat.legacy.experience_maker", "a producer of " + launch + " with core_algo='PPO'",
            "coati.experience_maker", "coati.experience_maker.base", "coati.experience_maker.naive")
    names("coati.experience_maker", "coati_compat.legacy.experience_maker", {
        "Experience": "coati_relay.rollout.Rollout",
        "ExperienceMaker": "a producer of " + launch,
        "NaiveExperienceMaker": "a producer of " + launch + " with core_algo='PPO'",
    })
    modules("coati_compat.legacy.experience", "coati_relay.rollout.Rollout", "coati.experience_buffer.utils",
            "coati.replay_buffer.utils")
    names("coati.experience_buffer.utils", "coati_compat.legacy.experience", {
        "BufferItem": "one row of coati_relay.rollout.Rollout",
        "split_experience_batch": "rows of the tensors of a coati_relay.rollout.Rollout",
        "make_experience_batch": "coati_relay.rollout.Rollout.concat",
        "zero_pad_sequences": "torch.nn.utils.rnn.pad_sequence",
    })
    # coati.replay_buffer (reference version) and coati.experience_buffer (final release): in-process buffers.
    modules("coati_compat.legacy.replay_buffer", queue, "coati.replay_buffer", "coati.replay_buffer.base",
            "coati.replay_buffer.naive", "coati.experience_buffer", "coati.experience_buffer.base",
            "coati.experience_buffer.naive")
    names("coati.replay_buffer", "coati_compat.legacy.replay_buffer",
          {"ReplayBuffer": queue, "NaiveReplayBuffer": queue})
    names("coati.experience_buffer", "coati_compat.legacy.replay_buffer",
          {"ExperienceBuffer": queue, "NaiveExperienceBuffer": queue})

    # coati.trainer.strategies: the strategies, mapped onto the engine's plugins.
    modules("coati_compat.legacy.strategies", plugins, "coati.trainer.strategies",
            "coati.trainer.strategies.base", "coati.trainer.strategies.naive", "coati.trainer.strategies.ddp",
            "coati.trainer.strategies.colossalai", "coati.trainer.strategies.sampler")
    names("coati.trainer.strategies", "coati_compat.legacy.strategies", {
        "Strategy": plugins,
        "NaiveStrategy": plugins,
        "DDPStrategy": "plugin 'ddp' in the " + plugins,
        "LowLevelZeroStrategy": "plugin 'zero2' in the " + plugins,
        "GeminiStrategy": "plugin 'gemini' in the " + plugins,
        "ColossalAIStrategy": "plugin 'gemini' (stage 3) or 'zero2' (stage 1-2) in the " + plugins,
        "DistributedSampler": "torch.utils.data.DistributedSampler",
    })

    modules("coati_compat.legacy.trainer_ppo", launch + " with core_algo='PPO'", "coati.trainer.ppo")
    names("coati.trainer.ppo", "coati_compat.legacy.trainer_ppo", {
        "_set_default_generate_kwargs": "the generation keywords of the producer's inference config",
    })

    # coati.dataset (final release): the datasets of ColossalChat's 2023 SFT, reward-model and PPO scripts.
    prompts = "a .jsonl or .csv prompt file as train_dataset_config={'path': ...} of " + launch
    tokenized = "ColossalChat's coati.dataset ({}) or your own torch Dataset"
    modules("coati_compat.legacy.datasets",
            prompts + " (RL prompts); " + tokenized.format("tokenize_sft, tokenize_rlhf"), "coati.dataset",
            "coati.dataset.prompt_dataset", "coati.dataset.reward_dataset", "coati.dataset.utils")
    modules("coati_compat.legacy.sft_datasets", tokenized.format("tokenize_sft"), "coati.dataset.sft_dataset")
    names("coati.dataset", "coati_compat.legacy.datasets", {
        "PromptDataset": prompts,
        "RmStaticDataset": tokenized.format("tokenize_rlhf"),
        "HhRlhfDataset": tokenized.format("tokenize_rlhf"),
        "is_rank_0": "torch.distributed.get_rank() == 0",
    })
    names("coati.dataset", "coati_compat.legacy.sft_datasets", {
        "SFTDataset": tokenized.format("tokenize_sft"),
        "SupervisedDataset": tokenized.format("tokenize_sft"),
    })

    # coati.models: the wrappers and model families, on transformers models.
    modules("coati_compat.legacy.models", hf_models, "coati.models")
    modules("coati_compat.legacy.model_base", hf_models, "coati.models.base")
    modules("coati_compat.legacy.model_families", hf_models,
            "coati.models.gpt", "coati.models.bloom", "coati.models.opt", "coati.models.llama")
    names("coati.models", "coati_compat.legacy.model_base", {
        "Actor": "transformers.AutoModelForCausalLM",
        "Critic": launch + " with core_algo='PPO' and a critic config",
        "RewardModel": launch + " with a reward-model config",
    })
    names("coati.models", "coati_compat.legacy.model_families", {
        f"{family}{role}": hf_models
        for family in ("GPT", "BLOOM", "OPT", "Llama") for role in ("Actor", "Critic", "RM")
    })
    names("coati.models.base", "coati_compat.legacy.model_base", {
        "get_base_model": "the Hugging Face model itself (a checkpoint path in the model configs of " + launch + ")",
    })
    glm = ("a GLM checkpoint transformers runs natively (transformers.GlmForCausalLM, loaded with "
           "transformers.AutoModelForCausalLM) in the model configs of " + launch)
    modules("coati_compat.legacy.chatglm", glm, "coati.models.chatglm", "coati.models.chatglm.chatglm_actor",
            "coati.models.chatglm.chatglm_tokenizer")
    names("coati.models.chatglm", "coati_compat.legacy.chatglm", {"ChatGLMActor": glm})
    names("coati.models.chatglm.chatglm_tokenizer", "coati_compat.legacy.chatglm",
          {"ChatGLMTokenizer": "transformers.AutoTokenizer with the GLM checkpoint's tokenizer"})
    modules("coati_compat.legacy.losses", "coati_relay.algorithms (policy and value losses)", "coati.models.loss")
    names("coati.models.loss", "coati_compat.legacy.losses", {
        "PolicyLoss": "coati_relay.algorithms policy loss",
        "ValueLoss": "coati_relay.algorithms value loss",
        "GPTLMLoss": "torch.nn.functional.cross_entropy over shifted logits",
        "PPOPtxActorLoss": "coati_relay.algorithms policy loss plus your own language-model loss term",
        "LogSigLoss": "-torch.nn.functional.logsigmoid(chosen - rejected).mean()",
        "LogExpLoss": "torch.nn.functional.softplus(rejected - chosen).mean()",
    })
    modules("coati_compat.legacy.rl_functions", "coati_relay.algorithms", "coati.models.utils")
    names("coati.models.utils", "coati_compat.legacy.rl_functions", {
        "compute_approx_kl": "coati_relay.algorithms KL estimators",
        "compute_reward": "coati_relay.algorithms KL reward shaping",
        "log_probs_from_logits": "coati_relay.algorithms",
        "calc_action_log_probs": "coati_relay.algorithms",
        "masked_mean": "coati_relay.algorithms.masked.masked_mean",
        "masked_normalize": "coati_relay.algorithms.masked.whiten",
        "normalize": "(x - x.mean(dim)) / x.std(dim, unbiased=False)",
        "convert_to_lora": "peft.get_peft_model(model, peft.LoraConfig(...))",
    })
    modules("coati_compat.legacy.generation", "vLLM or transformers generate through " + launch,
            "coati.models.generation")
    names("coati.models.generation", "coati_compat.legacy.generation", {
        "generate": "vLLM or transformers generate through " + launch,
    })

    # coati.quant: importable; the GPTQ loader says what to use instead.
    modules("coati_compat.legacy.quant", "transformers quantization_config, or an unquantized reference model",
            "coati.quant")
    names("coati.quant", "coati_compat.legacy.quant", {
        "llama_load_quant": "transformers quantization_config (GPTQ on CUDA), or an unquantized reference model",
        "low_resource_init": "transformers.initialization.no_init_weights",
    })
    return table


DEPRECATIONS: Dict[str, Deprecation] = _build_table()


def message(name: str) -> str:
    """The warning text for legacy name ``name``: what replaces it, when it goes, and where the guide says more."""
    entry = DEPRECATIONS.get(name)
    if entry is None:
        raise KeyError(f"{name!r} is not in the deprecation table (coati_compat.imports.deprecations.DEPRECATIONS)")
    return (f"{name} is deprecated and will be removed in coati-relay {entry.removal}; "
            f"use {entry.replacement} instead. See {entry.anchor}")


def _is_internal(frame: FrameType) -> bool:
    """True for frames of this package, of importlib and of frozen standard modules (import machinery, ``abc``)."""
    filename = frame.f_code.co_filename
    return filename.startswith((_PKG_DIR, _IMPORTLIB_DIR, "<frozen "))


def user_frame(start: Optional[FrameType] = None) -> Optional[FrameType]:
    """The first frame, from ``start`` (default: the caller) outwards, outside coati_compat and importlib."""
    frame = start if start is not None else sys._getframe(1)
    while frame is not None and _is_internal(frame):
        frame = frame.f_back
    return frame


def _warn_at(frame: Optional[FrameType], text: str) -> None:
    if frame is None:
        warnings.warn(text, FutureWarning, stacklevel=2)
        return
    globs = frame.f_globals
    warnings.warn_explicit(text, FutureWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=globs.get("__name__", "<string>"),
                           registry=globs.setdefault("__warningregistry__", {}))


def warn_deprecated(name: str, stacklevel: Optional[int] = None) -> None:
    """Emits the table's FutureWarning for ``name`` at the user's line, once per call site (default filter).

    stacklevel: as for ``warnings.warn`` (1 = the caller of this function); None finds the first frame outside
    coati_compat and importlib, which is the user's line for imports, calls and ``.remote()``.
    """
    text = message(name)
    if stacklevel is None:
        frame = user_frame(sys._getframe(1))
    else:
        if not isinstance(stacklevel, int) or stacklevel < 1:
            raise ValueError(f"stacklevel must be a positive int or None, got {stacklevel!r}")
        try:
            frame = sys._getframe(stacklevel)
        except ValueError:
            frame = None
    _warn_at(frame, text)


def _mark_pep702(obj: Any, text: str) -> Any:
    """Marks ``obj`` as deprecated for type checkers (PEP 702) without a runtime warning of its own."""
    try:
        from typing_extensions import deprecated as pep702
    except ImportError:
        pep702 = getattr(warnings, "deprecated", None)
    if pep702 is None:
        obj.__deprecated__ = text
        return obj
    return pep702(text, category=None)(obj)


T = TypeVar("T")


def _deprecated_api(name: str) -> Callable[[T], T]:
    """Decorator for the object the table lists as ``name``.

    Functions warn when called from user code; classes warn when user code instantiates them (instances of
    subclasses excepted) and when a subclass is defined outside coati_compat and Ray. Calls from inside
    coati_compat stay silent, so a legacy helper that builds legacy objects warns once, at the user's line.
    """
    text = message(name)

    def deco(obj: T) -> T:
        if isinstance(obj, type):
            _wrap_class(obj, text)
        elif callable(obj):
            inner = obj

            @functools.wraps(inner)
            def obj(*args: Any, **kwargs: Any) -> Any:  # type: ignore[no-redef]
                caller = sys._getframe(1)
                if not _is_internal(caller):
                    _warn_at(caller, text)
                return inner(*args, **kwargs)
        else:
            raise TypeError(f"deprecated_api({name!r}) needs a class or a function, got {type(obj).__name__}")
        return _mark_pep702(obj, text)

    return deco


if TYPE_CHECKING:
    # Type checkers see the PEP 702 decorator itself, so every decorated legacy name is reported as deprecated
    # (with its legacy dotted name as the message); at run time the table-driven decorator above is used.
    from typing_extensions import deprecated as deprecated_api
else:
    deprecated_api = _deprecated_api


def _wrap_class(cls: type, text: str) -> None:
    own_init = cls.__dict__.get("__init__")
    original_subclass = cls.__dict__.get("__init_subclass__")

    @functools.wraps(cls.__init__)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if type(self) is cls:
            caller = sys._getframe(1)
            if not _is_internal(caller):
                _warn_at(caller, text)
        if own_init is not None:
            own_init(self, *args, **kwargs)
        else:  # the class had no __init__: follow the instance's MRO (cooperative multiple inheritance)
            super(cls, self).__init__(*args, **kwargs)

    def __init_subclass__(sub: type, **kwargs: Any) -> None:
        module = getattr(sub, "__module__", "") or ""
        if not (module.startswith("coati_compat.") or module == "ray" or module.startswith("ray.")):
            _warn_at(user_frame(sys._getframe(1)), text)
        if original_subclass is not None:
            original_subclass.__func__(sub, **kwargs)
        else:
            super(cls, sub).__init_subclass__(**kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
