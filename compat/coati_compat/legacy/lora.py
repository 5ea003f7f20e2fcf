"""Legacy LoRA: ``coati.models.lora`` (``LoraLinear``, ``LoRAModule``, ``convert_to_lora_module``) and
``coati.ray.lora_constructor`` (``LoRAConfig``, ``LoRAConstructor``), the LoRA weight push of the Ray API.

``LORA_MANAGER`` (final release): with ``LORA_MANAGER.merge_weights = True``, ``eval()`` of any module merges
every LoRA layer inside it, and ``train()`` after that raises, as in the final release. Without it, a layer's own
``eval()`` merges when the layer was built with ``merge_weights`` (reference version), except under
``COATI_RELAY_LEGACY_NAMES=final``, where only the manager merges.

Deviation from the legacy code: ``LoRAConstructor.load_state_dict_increase`` *replaces* the LoRA delta
(``W = W0 + dW_k``) instead of adding every pushed delta to the current weight (``W0 + dW_1 + ... + dW_k``). The
trainer sends the current total ``lora_A``/``lora_B`` each time, so adding was double counting. ``W0`` is kept per
model and re-captured whenever the weight was changed by anything else (e.g. a full ``load_state_dict``).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from coati_compat.imports import legacy_switch
from coati_compat.imports.deprecations import deprecated_api
from coati_relay.parts import lora_delta, replace_delta

_LORA_KEYS = ("lora_A", "lora_B")
_BASE_ATTR = "_coati_lora_base"  # {name: (W0, tensor version after our last write)}, in the model's __dict__
_TRAIN_BIAS = ("none", "all", "lora_only")


@dataclass
class LoRAManager:
    """The final release's ``coati.models.lora.LORA_MANAGER``: ``merge_weights`` makes ``eval()`` (of the layer or
    of any module holding it) fold the LoRA delta into the weights."""

    merge_weights: bool = False


LORA_MANAGER = LoRAManager()


@deprecated_api("coati.models.lora.LoraLinear")
class LoraLinear(nn.Module):
    """A linear layer ``y = x W^T + b + scaling * dropout(x) A^T B^T`` with a frozen ``W`` and trainable A, B.

    weight: [out, in], as an ``nn.Linear`` holds it; with ``fan_in_fan_out`` the layer stores it transposed,
    [in, out], and transposes it back in the forward pass, as the legacy layer did. lora_A: [r, in]; lora_B:
    [out, r] (zero-initialised, so the layer starts equal to the plain linear); scaling = lora_alpha / r.

    ``merge_weights`` keeps the legacy merge: calling ``eval()`` *on this layer* folds ``scaling * B @ A`` into the
    weight and drops ``lora_A``/``lora_B``; the next ``train()`` (either mode) starts a fresh adapter (A random,
    B zero) over the merged weight. ``eval()`` of a parent module reaches layers as ``train(False)``, which merges
    nothing.
    """

    def __init__(self, weight: nn.Parameter, bias: Optional[nn.Parameter], r: int = 0, lora_alpha: int = 1,
                 lora_dropout: float = 0.0, fan_in_fan_out: bool = False, merge_weights: bool = True) -> None:
        super().__init__()
        if not isinstance(r, int) or r < 0:
            raise ValueError(f"LoraLinear: r must be an int >= 0, got {r!r}")
        self.weight = weight
        self.bias = bias
        self.r = r
        self.lora_alpha = lora_alpha
        self.fan_in_fan_out = fan_in_fan_out
        self.merge_weights = merge_weights
        self.merged = False
        self.lora_dropout = nn.Dropout(lora_dropout) if lora_dropout > 0 else nn.Identity()
        self.out_features, self.in_features = weight.shape
        if r > 0:  # a rank above min(in, out) is allowed, as in the legacy code (e.g. a critic's 1-row value head)
            self._new_adapter()
            self.scaling = lora_alpha / r
            self.weight.requires_grad_(False)
        if fan_in_fan_out:
            self.weight.data = self.weight.data.T

    def _new_adapter(self) -> None:
        self.lora_A = nn.Parameter(self.weight.new_empty(self.r, self.in_features))
        self.lora_B = nn.Parameter(self.weight.new_zeros(self.out_features, self.r))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def _t(self, w: torch.Tensor) -> torch.Tensor:
        return w.T if self.fan_in_fan_out else w

    def delta_weight(self) -> torch.Tensor:
        """``scaling * B @ A`` in the stored layout of ``weight``."""
        return self._t(self.lora_B @ self.lora_A) * self.scaling

    def _merge(self) -> None:
        if self.r > 0:
            self.weight.data += self.delta_weight()
            del self.lora_A, self.lora_B
        self.merged = True

    def train(self, mode: bool = True) -> "LoraLinear":
        super().train(mode)
        if LORA_MANAGER.merge_weights:  # final release: eval() of any parent merges, nothing unmerges
            if mode and self.merged:
                raise NotImplementedError("this LoRA layer was merged into its weight by eval() under "
                                          "LORA_MANAGER.merge_weights and cannot be unmerged (as in the final "
                                          "release); build the model again to train it")
            if not mode and not self.merged:
                self._merge()
            return self
        if self.merge_weights and self.merged:
            if self.r > 0:
                if hasattr(self, "lora_A") and hasattr(self, "lora_B"):
                    self.weight.data -= self.delta_weight()
                else:
                    self._new_adapter()
            self.merged = False
        return self

    def eval(self) -> "LoraLinear":
        super().eval()  # merges here under LORA_MANAGER.merge_weights (through train(False))
        if self.merge_weights and not self.merged and not legacy_switch.final_release():
            self._merge()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in] -> [..., out]."""
        out = F.linear(x, self._t(self.weight), self.bias)
        if self.r > 0 and not self.merged:
            out = out + (self.lora_dropout(x) @ self.lora_A.T @ self.lora_B.T) * self.scaling
        return out


def _mark_only_lora_trainable(module: nn.Module, lora_train_bias: str) -> None:
    for name, param in module.named_parameters():
        param.requires_grad_("lora_" in name)
    if lora_train_bias == "all":
        for name, param in module.named_parameters():
            if name.endswith("bias"):
                param.requires_grad_(True)
    elif lora_train_bias == "lora_only":
        for sub in module.modules():
            if isinstance(sub, LoraLinear) and sub.bias is not None:
                sub.bias.requires_grad_(True)


@deprecated_api("coati.models.lora.convert_to_lora_module")
def convert_to_lora_module(module: nn.Module, lora_rank: int, lora_train_bias: str = "none") -> nn.Module:
    """Replaces every ``nn.Linear`` inside ``module`` by a ``LoraLinear`` of rank ``lora_rank`` (in place) and
    leaves only the LoRA parameters trainable (plus biases: ``lora_train_bias`` in none | all | lora_only).
    ``lora_rank <= 0`` returns the module unchanged."""
    if lora_train_bias not in _TRAIN_BIAS:
        raise ValueError(f"lora_train_bias must be one of {_TRAIN_BIAS}, got {lora_train_bias!r}")
    if lora_rank <= 0:
        return module
    linears = [(name, sub) for name, sub in module.named_modules() if type(sub) is nn.Linear]
    for name, linear in linears:
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, LoraLinear(linear.weight, linear.bias, r=lora_rank, merge_weights=False))
    _mark_only_lora_trainable(module, lora_train_bias)
    return module


@deprecated_api("coati.models.lora.LoRAModule")
class LoRAModule(nn.Module):
    """Base of the legacy model wrappers: ``convert_to_lora()`` turns the linears of ``self`` into LoRA layers."""

    def __init__(self, lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        super().__init__()
        self.lora_rank = lora_rank
        self.lora_train_bias = lora_train_bias

    def convert_to_lora(self) -> None:
        convert_to_lora_module(self, self.lora_rank, self.lora_train_bias)


@deprecated_api("coati.ray.lora_constructor.LoRAConfig")
@dataclass
class LoRAConfig:
    r: int = 0
    lora_alpha: int = 1
    lora_dropout: float = 0
    fan_in_fan_out: bool = False


@deprecated_api("coati.ray.lora_constructor.LoRAConstructor")
class LoRAConstructor:
    """Turns pushed ``lora_A``/``lora_B`` tensors into dense weight deltas and applies them on a maker's model."""

    def __init__(self) -> None:
        self.lora_config_dict: Optional[Dict[str, LoRAConfig]] = None

    def register_lora_config(self, lora_config_dict: Dict[str, LoRAConfig]) -> None:
        self.lora_config_dict = lora_config_dict

    def reconstruct_increase(self, state_dict_lora: Dict[str, torch.Tensor],
                             lora_config_dict: Optional[Dict[str, LoRAConfig]] = None) -> Dict[str, torch.Tensor]:
        """``{prefix.weight: T(B @ A) * alpha / r}`` for each LoRA layer of ``state_dict_lora``.

        state_dict_lora: ``{prefix.lora_A: [r, in], prefix.lora_B: [out, r]}``; lora_config_dict: ``{prefix:
        LoRAConfig}`` (default: the registered one). A layer with r == 0 gives a zero delta.
        """
        configs = lora_config_dict if lora_config_dict is not None else self.lora_config_dict
        if configs is None:
            raise ValueError("reconstruct_increase needs a lora_config_dict (pass one, or register_lora_config first)")
        pairs: Dict[str, Dict[str, torch.Tensor]] = OrderedDict()
        for key, tensor in state_dict_lora.items():
            prefix, _, kind = key.rpartition(".")
            if kind not in _LORA_KEYS:
                raise ValueError(f"unexpected key {key!r} in a LoRA state dict: only '<layer>.lora_A' and "
                                 "'<layer>.lora_B' keys are allowed (filter with filter_state_dict_lora)")
            pairs.setdefault(prefix, {})[kind] = tensor
        increase: Dict[str, torch.Tensor] = OrderedDict()
        for prefix, pair in pairs.items():
            if set(pair) != set(_LORA_KEYS):
                raise ValueError(f"LoRA layer {prefix!r} has only {sorted(pair)}; both lora_A and lora_B are needed")
            if prefix not in configs:
                raise ValueError(f"no LoRAConfig for layer {prefix!r}; known layers: {sorted(configs)[:8]}...")
            cfg = configs[prefix]
            a, b = pair["lora_A"], pair["lora_B"]
            if cfg.r == 0:
                delta = a.new_zeros(b.size(0), a.size(1))
            else:
                delta = lora_delta(a, b, cfg.lora_alpha / cfg.r).to(a.dtype)
            increase[f"{prefix}.weight"] = delta.T if cfg.fan_in_fan_out else delta
        return increase

    @staticmethod
    def load_state_dict_increase(model: nn.Module, state_dict_increase: Dict[str, torch.Tensor]) -> None:
        """Sets each named weight to ``W0 + increase`` (replacing the previous delta; see the module docstring).

        ``W0`` is the weight as first seen here, re-captured when something else has written the weight since.
        """
        tensors = dict(model.named_parameters())
        tensors.update(model.named_buffers())
        missing = [k for k in state_dict_increase if k not in tensors]
        if missing:
            raise ValueError(f"LoRA increase keys {missing[:4]} are not weights of {type(model).__name__}; keys "
                             "must be the model's own names (Hugging Face keys for actors)")
        bases: Dict[str, Tuple[torch.Tensor, int]] = model.__dict__.setdefault(_BASE_ATTR, {})
        with torch.no_grad():
            for key, delta in state_dict_increase.items():
                weight = tensors[key]
                if key not in bases or bases[key][1] != weight._version:
                    bases[key] = (weight.detach().clone(), -1)
                base = bases[key][0]
                weight.copy_(replace_delta(base, delta))
                bases[key] = (base, weight._version)

    @staticmethod
    def filter_state_dict_lora(state_dict: Dict[str, torch.Tensor], keep_non_lora: bool = False
                               ) -> Tuple[Dict[str, torch.Tensor], Optional[Dict[str, torch.Tensor]]]:
        """Splits a state dict into (LoRA entries, the rest or None). A key is LoRA if it has lora_A or lora_B."""
        lora: Dict[str, torch.Tensor] = OrderedDict()
        rest: Optional[Dict[str, torch.Tensor]] = OrderedDict() if keep_non_lora else None
        for key, value in state_dict.items():
            if any(k in key for k in _LORA_KEYS):
                lora[key] = value
            elif rest is not None:
                rest[key] = value
        return lora, rest

    @staticmethod
    def extract_lora_config(model: nn.Module) -> Dict[str, LoRAConfig]:
        """``{module name: LoRAConfig}`` over the ``LoraLinear`` modules of ``model``, in module order."""
        configs: Dict[str, LoRAConfig] = OrderedDict()
        for name, module in model.named_modules():
            if isinstance(module, LoraLinear):
                dropout = module.lora_dropout.p if isinstance(module.lora_dropout, nn.Dropout) else 0
                configs[name] = LoRAConfig(module.r, module.lora_alpha, dropout, module.fan_in_fan_out)
        return configs
