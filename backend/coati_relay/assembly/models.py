"""The model sections of a run: the checkpoints (policy, critic, reward model), the tokenizer, LoRA, and the
producers' engine keywords (`coati_relay.assembly.inference_config`)."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from coati_relay.assembly.inference_config import check_inference_config
from coati_relay.cluster.devices import flash_attention_available
from coati_relay.config.checks import Check, is_number, is_positive, is_positive_int
from coati_relay.config.schema import Models, Roles
from coati_relay.training.booster_backend import LORA_KEYS

log = logging.getLogger(__name__)



def _model_path(errors: List[str], name: str, cfg: Dict[str, Any], resolved: Dict[str, str]) -> str:
    """``cfg['path']`` as the actors get it: a local directory as given, a Hugging Face Hub ID as its snapshot in
    the cache (`coati_relay.config.hub`; ``resolved`` keeps each ID's answer, so one run looks each up once)."""
    path = cfg.get("path")
    if not path or not isinstance(path, (str, os.PathLike)):
        errors.append(f"{name}['path'] is required: a local directory holding a transformers checkpoint, or a "
                      f"Hugging Face Hub ID such as 'Qwen/Qwen2.5-7B'")
        return ""
    local = _local(errors, f"{name}['path']", str(path), resolved)
    if local is None:
        return ""
    if not Path(local).is_dir() or not (Path(local) / "config.json").exists():
        shown = repr(str(path)) if local == str(path) else f"{str(path)!r} (cached at {local})"
        errors.append(f"{name}['path'] = {shown} is not a local model directory (no config.json there): save one "
                      f"with save_pretrained(), or give a Hugging Face Hub ID")
    return local


def _local(errors: List[str], what: str, value: str, resolved: Dict[str, str]) -> Optional[str]:
    """The local directory of ``value`` (a path or a Hub ID); None, with the error recorded, when there is none."""
    from coati_relay.config.hub import HubModelError, local_model_dir

    if value not in resolved:
        try:
            resolved[value] = local_model_dir(value, what) or value
        except HubModelError as exc:
            errors.append(str(exc))
            return None
    return resolved[value]


def _check_tokenizer(errors: List[str], tokenizer_path: str, kwargs: Dict[str, Any]) -> None:
    if not tokenizer_path or any("tokenizer" in e or "path" in e for e in errors):
        return
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_path, **kwargs)
    except Exception as exc:  # transformers raises many types here
        shown = f" with tokenizer_config {kwargs}" if kwargs else ""
        errors.append(f"cannot load a tokenizer from {tokenizer_path!r}{shown}: {exc}")
        return
    if tok.pad_token_id is None:
        errors.append(f"the tokenizer at {tokenizer_path!r} has no pad token; set one (e.g. "
                      f"tokenizer.pad_token = tokenizer.eos_token) and save it, or pass tokenizer_config['path']")
    if tok.eos_token_id is None:
        errors.append(f"the tokenizer at {tokenizer_path!r} has no EOS token; responses could never end")


def build_models(errors: List[str], roles: Roles, imc: Dict[str, Any], tmc: Dict[str, Any], tokc: Dict[str, Any],
                 critic_cfg: Dict[str, Any], rm_cfg: Dict[str, Any], core_algo: str,
                 needs_critic: Optional[bool], differences: Optional[List[str]] = None,
                 cuda: Optional[bool] = None) -> Models:
    """needs_critic: whether the algorithm trains a critic (None: the algorithm is unknown). ``differences``
    collects what this host runs differently from ColossalChat (flash attention, half precision without CUDA)."""
    differences = [] if differences is None else differences
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    resolved: Dict[str, str] = {}  # path or Hub ID as given -> local directory
    model_path = _model_path(errors, "inference_model_config", imc, resolved)
    train_path = _model_path(errors, "train_model_config", tmc, resolved) if tmc.get("path") else model_path
    if model_path and train_path and Path(model_path).resolve() != Path(train_path).resolve():
        log.info("producers generate from %s, consumers train %s", model_path, train_path)
    tokenizer_path = model_path
    if tokc.get("path"):
        tokenizer_path = _local(errors, "tokenizer_config['path']", str(tokc["path"]), resolved) or ""
    tokenizer_kwargs = {k: v for k, v in tokc.items() if k != "path"}
    _check_tokenizer(errors, tokenizer_path, tokenizer_kwargs)
    rm_path = _model_path(errors, "reward_model_config", rm_cfg, resolved) if rm_cfg else None
    critic_path = _model_path(errors, "critic_model_config", critic_cfg, resolved) if critic_cfg else None
    if needs_critic and critic_path is None:
        critic_path = train_path  # value head on a copy of the policy's trunk
    if critic_cfg and needs_critic is False:
        errors.append(f"critic_model_config is only used by algorithms with a critic (PPO), not {core_algo!r}; "
                      f"drop it")
    engine_kwargs = check_inference_config(errors, roles.inference_backend, imc, roles.num_proc_per_producer,
                                           differences, cuda)
    return Models(model_path=model_path, train_path=train_path, tokenizer_path=tokenizer_path,
                  inference_model_kwargs=engine_kwargs, lora=_lora(errors, tmc.get("lora")),
                  critic_model_path=critic_path, reward_model_path=rm_path,
                  gradient_checkpointing=_flag_key(errors, "train_model_config", "gradient_checkpointing", tmc),
                  keep_dropout=_flag_key(errors, "train_model_config", "keep_dropout", tmc),
                  train_model_kwargs=from_pretrained_kwargs(errors, "train_model_config", tmc, differences, cuda),
                  tokenizer_kwargs=tokenizer_kwargs)


# train_model_config keys passed to from_pretrained (ColossalChat passes every key but path and checkpoint_path).
FROM_PRETRAINED_KEYS = ("use_flash_attention_2", "use_cache", "torch_dtype", "attn_implementation",
                        "trust_remote_code")
_DTYPES = ("float32", "bfloat16", "float16")


def from_pretrained_kwargs(errors: List[str], section: str, cfg: Dict[str, Any], differences: List[str],
                           cuda: bool) -> Dict[str, Any]:
    """The keywords of ``AutoModelForCausalLM.from_pretrained`` that ``cfg`` (ColossalChat's model config) gives,
    in transformers 5 form: ``torch_dtype`` (a torch dtype or its name) as ``dtype``; ``use_flash_attention_2=True``
    as ``attn_implementation="flash_attention_2"`` where CUDA and flash-attn are present, else the default attention
    (a difference); without CUDA, half precision trains in float32 (a difference)."""
    import torch

    out: Dict[str, Any] = {}
    for key in ("use_cache", "trust_remote_code", "use_flash_attention_2"):
        if key in cfg and not isinstance(cfg[key], bool):
            errors.append(f"{section}[{key!r}] must be True or False, got {cfg[key]!r}")
    if "use_cache" in cfg:
        out["use_cache"] = cfg["use_cache"]
    if "trust_remote_code" in cfg:
        out["trust_remote_code"] = cfg["trust_remote_code"]
    if "attn_implementation" in cfg:
        if not isinstance(cfg["attn_implementation"], str):
            errors.append(f"{section}['attn_implementation'] must be a str such as 'sdpa' or 'eager', got "
                          f"{cfg['attn_implementation']!r}")
        out["attn_implementation"] = cfg["attn_implementation"]
    if cfg.get("use_flash_attention_2") is True and "attn_implementation" not in out:
        if flash_attention_available(cuda):
            out["attn_implementation"] = "flash_attention_2"
        else:
            differences.append(f"{section}['use_flash_attention_2']=True: flash attention 2 needs CUDA and the "
                               f"flash-attn package, which this host lacks; the model's default attention runs "
                               f"instead")
    if "torch_dtype" in cfg:
        dtype = cfg["torch_dtype"]
        if isinstance(dtype, str) and dtype in _DTYPES:
            dtype = getattr(torch, dtype)
        if dtype not in tuple(getattr(torch, n) for n in _DTYPES):
            errors.append(f"{section}['torch_dtype'] must be a torch dtype or one of {list(_DTYPES)}, got "
                          f"{cfg['torch_dtype']!r}")
        elif dtype != torch.float32 and not cuda:
            differences.append(f"{section}['torch_dtype']={dtype}: half precision trains only with CUDA here; the "
                               f"model loads in torch.float32 instead")
        else:
            out["dtype"] = dtype
    return out


def _flag_key(errors: List[str], section: str, key: str, cfg: Dict[str, Any]) -> bool:
    value = cfg.get(key, False)
    if not isinstance(value, bool):
        errors.append(f"{section}[{key!r}] must be True or False, got {value!r}")
        return False
    return value


LORA_CHECKS = {
    "r": Check(is_positive_int, "an int > 0 (the rank; None for full training)"),
    "alpha": Check(is_positive, "a number > 0"),
    "dropout": Check(lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "target_modules": Check(lambda v: v is None or isinstance(v, str) or (
        isinstance(v, (list, tuple)) and bool(v) and all(isinstance(m, str) and m for m in v)),
        "None (peft's default), a module name or a non-empty list of module names"),
}


def _lora(errors: List[str], lora: Any) -> Optional[Dict[str, Any]]:
    """train_model_config['lora']: None (full training) or {"r": rank, "alpha", "target_modules", "dropout"}."""
    if lora is None:
        return None
    if not isinstance(lora, dict) or "r" not in lora or set(lora) - set(LORA_KEYS):
        errors.append(f"train_model_config['lora'] must be None (full training) or a dict with 'r' and optionally "
                      f"{list(LORA_KEYS[1:])}, got {lora!r}")
        return None
    for key, value in lora.items():
        check = LORA_CHECKS[key]
        if not check.ok(value):
            errors.append(f"train_model_config['lora'][{key!r}] must be {check.expect}, got {value!r}")
    return dict(lora)
