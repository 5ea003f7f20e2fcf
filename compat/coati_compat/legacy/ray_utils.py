"""Legacy ``coati.ray.utils``: rank helpers, model/strategy/tokenizer factories, the Ray topology helper and
state-dict casting.

Deviations from the legacy code: ``state_dict_to`` casts only floating-point tensors (the legacy one cast integer
and bool buffers to float16 too); ``get_strategy_from_args`` keeps the reference version's ``"naive"``;
``get_tokenizer_from_args`` loads from a local path (``pretrain=``) because nothing is downloaded at run time.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.model_families import ACTORS, CRITICS, REWARD_MODELS
from coati_compat.legacy.strategies import DDPStrategy, GeminiStrategy, LowLevelZeroStrategy, NaiveStrategy, Strategy
from coati_compat.legacy.tables import LEGACY_STRATEGIES
from coati_relay.parts import announce_member

_DIST_ENV_KEYS = {"rank": "RANK", "local_rank": "LOCAL_RANK", "world_size": "WORLD_SIZE",
                  "master_port": "MASTER_PORT", "master_addr": "MASTER_ADDR"}


_STRATEGY_CLASSES = {cls.__name__: cls for cls in (NaiveStrategy, DDPStrategy, LowLevelZeroStrategy, GeminiStrategy)}

# Hub names of the legacy tokenizers (llama had none: it used ``pretrain``).
TOKENIZER_HUB_NAMES = {"gpt2": "gpt2", "bloom": "bigscience/bloom-560m", "opt": "facebook/opt-350m"}


@deprecated_api("coati.ray.utils.is_rank_0")
def is_rank_0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


@deprecated_api("coati.ray.utils.get_rank")
def get_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


@deprecated_api("coati.ray.utils.get_world_size")
def get_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _family(table: Dict[str, Any], model: str, what: str) -> Any:
    if model not in table:
        raise ValueError(f'Unsupported {what} model "{model}"; choose one of {sorted(table)}')
    return table[model]


@deprecated_api("coati.ray.utils.get_actor_from_args")
def get_actor_from_args(model: str, pretrained: Optional[str] = None, config: Any = None, lora_rank: int = 0):
    """``GPTActor | BLOOMActor | OPTActor | LlamaActor`` for ``model`` in gpt2 | bloom | opt | llama."""
    return _family(ACTORS, model, "actor")(pretrained=pretrained, config=config, lora_rank=lora_rank)


@deprecated_api("coati.ray.utils.get_critic_from_args")
def get_critic_from_args(model: str, pretrained: Optional[str] = None, config: Any = None, lora_rank: int = 0):
    """The family's critic, valued on the prompt tokens (``use_action_mask=True``, as the reference version)."""
    return _family(CRITICS, model, "critic")(pretrained=pretrained, config=config, lora_rank=lora_rank,
                                               use_action_mask=True)


@deprecated_api("coati.ray.utils.get_reward_model_from_args")
def get_reward_model_from_args(model: str, pretrained: Optional[str] = None, config: Any = None):
    return _family(REWARD_MODELS, model, "reward")(pretrained=pretrained, config=config)


@deprecated_api("coati.ray.utils.get_strategy_from_args")
def get_strategy_from_args(strategy: str) -> Strategy:
    """naive | ddp | colossalai_gemini | colossalai_zero2 | colossalai_gemini_cpu | colossalai_zero2_cpu (the
    strategies of ``coati_compat.legacy.tables.LEGACY_STRATEGIES``)."""
    entry = _family(LEGACY_STRATEGIES, strategy, "strategy")
    return _STRATEGY_CLASSES[entry.cls](**entry.options)


@deprecated_api("coati.ray.utils.get_tokenizer_from_args")
def get_tokenizer_from_args(model: str, **kwargs: Any):
    """The family's tokenizer with ``pad_token = eos_token``, loaded from the local path ``pretrain=`` (or from the
    local Hugging Face cache for the legacy hub names)."""
    _family(ACTORS, model, "tokenizer")
    from transformers import AutoTokenizer

    pretrain = kwargs.get("pretrain")
    if pretrain is not None and os.path.isdir(str(pretrain)):
        tokenizer = AutoTokenizer.from_pretrained(pretrain)
    elif model in TOKENIZER_HUB_NAMES:
        name = TOKENIZER_HUB_NAMES[model]
        try:
            tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except OSError as err:
            raise ValueError(f"the {model} tokenizer is the hub name {name!r}, which is not in the local cache, and "
                             "nothing is downloaded at run time; pass pretrain=<local tokenizer dir>") from err
    else:
        raise ValueError(f"the {model} tokenizer needs pretrain=<local tokenizer dir>, got {pretrain!r}")
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@deprecated_api("coati.ray.utils.set_dist_env")
def set_dist_env(env_info: Dict[str, str]) -> None:
    """Sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_PORT and MASTER_ADDR from the keys rank, local_rank, world_size,
    master_port and master_addr; every value must be a string."""
    missing = [k for k in _DIST_ENV_KEYS if k not in env_info]
    if missing:
        raise ValueError(f"env_info lacks {missing}; it needs the keys {sorted(_DIST_ENV_KEYS)}")
    wrong = {k: type(env_info[k]).__name__ for k in _DIST_ENV_KEYS if not isinstance(env_info[k], str)}
    if wrong:
        raise TypeError(f"env_info values must be strings (e.g. str(rank)); got {wrong}")
    for key, var in _DIST_ENV_KEYS.items():
        os.environ[var] = env_info[key]
    # Inside a Ray actor, the rank announces itself to its group now, before anything that may fail: the ranks
    # waiting for it at the rendezvous then notice its death at once (not after DIST_TIMEOUT_S).
    announce_member(env_info["master_addr"], int(env_info["master_port"]), int(env_info["world_size"]),
                    int(env_info["rank"]))


@deprecated_api("coati.ray.utils.get_model_numel")
def get_model_numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@deprecated_api("coati.ray.utils.get_grad_required_state_dict")
def get_grad_required_state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    """``{name: parameter data}`` of the parameters that require grad."""
    return OrderedDict((n, p.data) for n, p in model.named_parameters() if p.requires_grad)


@deprecated_api("coati.ray.utils.get_receivers_per_sender")
def get_receivers_per_sender(sender_idx: int, num_senders: int, num_receivers: int,
                             allow_idle_sender: bool) -> List[int]:
    """Receivers of one sender: every ``i`` with ``i % num_senders == sender_idx`` when ``num_senders <=
    num_receivers`` or ``allow_idle_sender``, else the single receiver ``sender_idx % num_receivers``."""
    for name, value in (("sender_idx", sender_idx), ("num_senders", num_senders), ("num_receivers", num_receivers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if num_senders < 1 or num_receivers < 1 or sender_idx >= num_senders:
        raise ValueError(f"need 0 <= sender_idx < num_senders and num_receivers >= 1; got sender_idx={sender_idx}, "
                         f"num_senders={num_senders}, num_receivers={num_receivers}")
    if num_senders <= num_receivers or allow_idle_sender:
        return list(range(sender_idx, num_receivers, num_senders))
    return [sender_idx % num_receivers]


@deprecated_api("coati.ray.utils.state_dict_to")
def state_dict_to(state_dict: Dict[str, torch.Tensor], dtype: torch.dtype = torch.float16,
                  device: torch.device | str = torch.device("cpu")) -> Dict[str, torch.Tensor]:
    """A new ordered dict with every tensor on ``device`` and every floating-point tensor in ``dtype``; integer and
    bool tensors keep their dtype. The input is left untouched."""
    return OrderedDict((k, v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device=device))
                       for k, v in state_dict.items())
