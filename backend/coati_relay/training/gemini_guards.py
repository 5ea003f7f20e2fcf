"""What a model held by Gemini (ColossalAI's chunked ZeRO-3, plugin ``"gemini"``) needs around it.

Gemini keeps a model's parameters in flat chunks. Chunks of a model under ``min_chunk_size_m`` (32 Mi elements by
default) stay gathered; above it each chunk is gathered by Gemini's hooks for a forward or backward and scattered
after, its storage freed while the module's parameters still point into it. So nothing reads those parameters
outside Gemini's own forward, backward, ``state_dict`` and optimizer step:

- `AliasLoad`: Gemini writes a tied parameter under every name it has (GPT-2's ``lm_head.weight`` beside
  ``transformer.wte.weight``), and so do torch and Hugging Face state dicts; its strict ``load_state_dict`` accepts
  only the names ``named_parameters()`` gives once. A load pre-hook folds each alias into its first name.
- `GeminiStepGuard`: without ``enable_gradient_accumulation`` Gemini writes a backward's gradients over the
  low-precision weights until the optimizer step, so a second backward before the step trains on gradients as
  weights; the guard counts them and refuses the second. Non-finite gradients come from Gemini's own overflow
  counter (fp16: Gemini skips the step and backs off its loss scale, and the guard reads each skip; bf16: the guard
  refuses the step), not from reading the weights.
- `releases_parameters`: whether Gemini scatters the model's chunks (then sampling from its parameters is refused).
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from torch import nn

GEMINI = "gemini"


class GradientAccumulationError(RuntimeError):
    """A second backward before the optimizer step where the plugin cannot accumulate gradients."""


def tied_aliases(module: nn.Module) -> Dict[str, str]:
    """``{alias: name}`` for every parameter reachable under more than one name: ``name`` is the one
    ``named_parameters()`` gives it, each alias another path to the same tensor (a tied ``lm_head.weight``)."""
    first: Dict[int, str] = {}
    for name, param in module.named_parameters():
        first.setdefault(id(param), name)
    aliases: Dict[str, str] = {}
    for module_name, sub in module.named_modules(remove_duplicate=False):
        for param_name, param in sub.named_parameters(recurse=False, remove_duplicate=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            name = first.get(id(param))
            if name is not None and name != full:
                aliases[full] = name
    return aliases


def _same(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a is b
    return a.shape == b.shape and torch.equal(a.detach().cpu(), b.detach().to("cpu", a.dtype))


def fold_tied_aliases(aliases: Mapping[str, str], state_dict: Dict[str, Any], prefix: str, local_metadata: Any,
                      strict: bool, missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """A load-state-dict pre-hook (torch's argument order): drops each alias of ``aliases`` from ``state_dict``
    (the loader's own copy), keeping its value under the parameter's first name where that is absent; an alias whose
    value differs from the first name's is an error of the load (the file is not of this tied model)."""
    for alias, name in aliases.items():
        alias_key, key = prefix + alias, prefix + name
        if alias_key not in state_dict:
            continue
        value = state_dict.pop(alias_key)
        if key not in state_dict:
            state_dict[key] = value
        elif not _same(state_dict[key], value):
            error_msgs.append(f"{alias_key!r} and {key!r} name one tied parameter of this model, but the state dict "
                              "holds different values under them")


class AliasLoad:
    """Installs `fold_tied_aliases` on a Gemini-wrapped model (its ``_load_from_state_dict`` runs the pre-hooks
    before its strict key check, in whole-file and sharded loads alike)."""

    @staticmethod
    def install(model: nn.Module) -> Dict[str, str]:
        """Registers the hook on ``model`` when it has tied parameters; returns the aliases it folds."""
        aliases = tied_aliases(model)
        if aliases:
            model._register_load_state_dict_pre_hook(functools.partial(fold_tied_aliases, aliases))
        return aliases


def releases_parameters(model: nn.Module) -> bool:
    """Whether Gemini scatters any of ``model``'s chunks between its hooks (the model is above its keep-gathered
    size): then the parameters' storage is freed outside its forward, backward and state dict."""
    manager = getattr(model, "chunk_manager", None)
    if manager is None:
        return False
    return any(not chunk.keep_gathered for chunks in manager.chunk_groups.values() for chunk in chunks)


def refusal(what: str, name: str) -> str:
    """The message refusing ``what`` on the Gemini-held model ``name``."""
    return (f"{what} on the {name} is refused: Gemini (ZeRO-3) holds its parameters in chunks that it scatters "
            "between its own forward and backward, so reading them outside those would read freed memory. Gather "
            "the weights with the strategy's get_model_state_dict_shard or save_model, or prepare this model with "
            "a strategy that keeps whole parameters (naive, ddp, LowLevelZero)")


class GeminiStepGuard:
    """The backward count and overflow count of one Gemini-wrapped model between optimizer steps.

    model: the ``GeminiDDP`` (what is read of it: ``chunk_manager.overflow_counter``, the number of gradient
    chunks Gemini found holding inf/NaN). options: the plugin's options (``enable_gradient_accumulation``,
    ``precision``). name: what errors call the model.
    """

    def __init__(self, model: nn.Module, options: Mapping[str, Any], name: str) -> None:
        self.model, self.name = model, name
        self.accumulates = bool(options.get("enable_gradient_accumulation"))
        self.skips_overflow = options.get("precision") == "fp16"  # Gemini's loss scaler skips such steps
        self.backwards = 0
        self._overflows_seen = 0
        self.skipped_in_a_row = 0  # fp16: steps Gemini skipped for an overflow since the last one it applied

    def before_backward(self) -> None:
        """Raises `GradientAccumulationError` at a second backward since the step when Gemini cannot accumulate."""
        if self.backwards and not self.accumulates:
            raise GradientAccumulationError(
                f"a second backward of the {self.name} before its optimizer step under plugin 'gemini' without "
                "gradient accumulation: Gemini writes each backward's gradients over the low-precision weights until "
                "the step, so this micro-batch would run on gradients as weights and overwrite the first one's "
                "gradients. Step after every backward, or build the backend with plugin_options="
                "{'enable_gradient_accumulation': True} (the consumer does so when a step has several micro-batches)")
        self.backwards += 1

    def non_finite_gradients(self) -> Optional[int]:
        """The gradient chunks Gemini found non-finite since the last call (one host read); None under fp16, where
        Gemini itself skips the step and lowers its loss scale."""
        if self.skips_overflow:
            return None
        seen = int(self.model.chunk_manager.overflow_counter.sum().item())
        new, self._overflows_seen = seen - self._overflows_seen, seen
        return new

    def overflow_skip(self, optimizer: Any) -> Optional[Tuple[float, float]]:
        """Under fp16, after the optimizer step: ``(loss scale now, its minimum)`` when Gemini skipped that step for
        an overflow (its loss scaler's verdict, agreed over the ranks: ``found_overflow``), else None; counts
        `skipped_in_a_row`. None under bf16, and for an optimizer without Gemini's fp16 mixin."""
        mixin = getattr(optimizer, "mix_precision_mixin", None)
        found = getattr(mixin, "found_overflow", None)
        if not self.skips_overflow or found is None:
            return None
        if not bool(found.item() > 0):
            self.skipped_in_a_row = 0
            return None
        self.skipped_in_a_row += 1
        scaler = mixin.grad_scaler
        minimum = getattr(scaler, "_min_scale", None)  # a tensor [1], or None for no floor
        return float(scaler.scale.item()), 0.0 if minimum is None else float(minimum)

    def stepped(self) -> None:
        self.backwards = 0
