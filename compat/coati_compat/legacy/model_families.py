"""Legacy ``coati.models.{gpt,bloom,opt,llama}``: actor, critic and reward-model classes of four model families,
built on transformers models.

Every class takes ``(pretrained=None, config=None, checkpoint=False, lora_rank=0, lora_train_bias="none")``:
``pretrained`` loads a checkpoint (in float32, as transformers 4 did), else ``config`` builds random weights of
that shape, else the family's default configuration (its default size) is used. ``checkpoint`` turns on gradient
checkpointing. Critics pass further keywords (``use_action_mask``) to ``Critic``.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, NamedTuple, Optional

import torch
from torch import nn

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.model_base import Actor, Critic, RewardModel, _value_head


class _Family(NamedTuple):
    config_class: str
    causal_lm_class: str
    body_class: str


FAMILIES = {
    "gpt2": _Family("GPT2Config", "GPT2LMHeadModel", "GPT2Model"),
    "bloom": _Family("BloomConfig", "BloomForCausalLM", "BloomModel"),
    "opt": _Family("OPTConfig", "OPTForCausalLM", "OPTModel"),
    "llama": _Family("LlamaConfig", "LlamaForCausalLM", "LlamaModel"),
}


def build_hf_model(family: str, kind: str, pretrained: Optional[str] = None, config: Any = None,
                   checkpoint: bool = False) -> nn.Module:
    """The transformers model of ``family`` (gpt2 | bloom | opt | llama); ``kind`` is "causal_lm" or "body"."""
    transformers = importlib.import_module("transformers")
    spec = FAMILIES[family]
    cls = getattr(transformers, spec.causal_lm_class if kind == "causal_lm" else spec.body_class)
    if pretrained is not None:
        try:
            model = cls.from_pretrained(pretrained, dtype=torch.float32)
        except OSError as err:
            if os.path.isdir(str(pretrained)):
                raise
            raise ValueError(f"pretrained={pretrained!r} is not a local checkpoint directory and nothing is "
                             "downloaded at run time; pass the path of a local checkpoint") from err
    else:
        if config is None:
            config = getattr(transformers, spec.config_class)()
        model = cls(config)
    if checkpoint:
        model.gradient_checkpointing_enable()
    return model


def _hidden_size(model: nn.Module) -> int:
    """Width of ``last_hidden_state`` (OPT projects it to ``word_embed_proj_dim``)."""
    cfg = model.config
    return getattr(cfg, "word_embed_proj_dim", None) or cfg.hidden_size


def _actor(family: str, pretrained: Optional[str], config: Any, checkpoint: bool) -> nn.Module:
    return build_hf_model(family, "causal_lm", pretrained, config, checkpoint)


def _body_and_head(family: str, pretrained: Optional[str], config: Any, checkpoint: bool, rm: bool):
    body = build_hf_model(family, "body", pretrained, config, checkpoint)
    hidden = _hidden_size(body)
    return body, _value_head(hidden, std=1 / (hidden + 1) if rm else None)


# One block per family; the signatures are the legacy ones.

@deprecated_api("coati.models.GPTActor")
class GPTActor(Actor):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        super().__init__(_actor("gpt2", pretrained, config, checkpoint), lora_rank, lora_train_bias)


@deprecated_api("coati.models.GPTCritic")
class GPTCritic(Critic):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none", **kwargs: Any) -> None:
        body, head = _body_and_head("gpt2", pretrained, config, checkpoint, rm=False)
        super().__init__(body, head, lora_rank, lora_train_bias, **kwargs)


@deprecated_api("coati.models.GPTRM")
class GPTRM(RewardModel):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        body, head = _body_and_head("gpt2", pretrained, config, checkpoint, rm=True)
        super().__init__(body, head, lora_rank, lora_train_bias)


@deprecated_api("coati.models.BLOOMActor")
class BLOOMActor(Actor):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        super().__init__(_actor("bloom", pretrained, config, checkpoint), lora_rank, lora_train_bias)


@deprecated_api("coati.models.BLOOMCritic")
class BLOOMCritic(Critic):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none", **kwargs: Any) -> None:
        body, head = _body_and_head("bloom", pretrained, config, checkpoint, rm=False)
        super().__init__(body, head, lora_rank, lora_train_bias, **kwargs)


@deprecated_api("coati.models.BLOOMRM")
class BLOOMRM(RewardModel):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        body, head = _body_and_head("bloom", pretrained, config, checkpoint, rm=True)
        super().__init__(body, head, lora_rank, lora_train_bias)


@deprecated_api("coati.models.OPTActor")
class OPTActor(Actor):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        super().__init__(_actor("opt", pretrained, config, checkpoint), lora_rank, lora_train_bias)


@deprecated_api("coati.models.OPTCritic")
class OPTCritic(Critic):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none", **kwargs: Any) -> None:
        body, head = _body_and_head("opt", pretrained, config, checkpoint, rm=False)
        super().__init__(body, head, lora_rank, lora_train_bias, **kwargs)


@deprecated_api("coati.models.OPTRM")
class OPTRM(RewardModel):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        body, head = _body_and_head("opt", pretrained, config, checkpoint, rm=True)
        super().__init__(body, head, lora_rank, lora_train_bias)


@deprecated_api("coati.models.LlamaActor")
class LlamaActor(Actor):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        super().__init__(_actor("llama", pretrained, config, checkpoint), lora_rank, lora_train_bias)


@deprecated_api("coati.models.LlamaCritic")
class LlamaCritic(Critic):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none", **kwargs: Any) -> None:
        body, head = _body_and_head("llama", pretrained, config, checkpoint, rm=False)
        super().__init__(body, head, lora_rank, lora_train_bias, **kwargs)


@deprecated_api("coati.models.LlamaRM")
class LlamaRM(RewardModel):
    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False,
                 lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        body, head = _body_and_head("llama", pretrained, config, checkpoint, rm=True)
        super().__init__(body, head, lora_rank, lora_train_bias)


ACTORS = {"gpt2": GPTActor, "bloom": BLOOMActor, "opt": OPTActor, "llama": LlamaActor}
CRITICS = {"gpt2": GPTCritic, "bloom": BLOOMCritic, "opt": OPTCritic, "llama": LlamaCritic}
REWARD_MODELS = {"gpt2": GPTRM, "bloom": BLOOMRM, "opt": OPTRM, "llama": LlamaRM}
