"""The model sections of a run: the checkpoints (policy, critic, reward model), the tokenizer, LoRA, and the
producers' engine keywords (`coati_relay.config.inference`)."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from coati_relay.config.checks import is_int, is_number
from coati_relay.config.inference import check_inference_config
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


def _check_tokenizer(errors: List[str], tokenizer_path: str) -> None:
    if not tokenizer_path or any("tokenizer" in e or "path" in e for e in errors):
        return
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_path)
    except Exception as exc:  # transformers raises many types here
        errors.append(f"cannot load a tokenizer from {tokenizer_path!r}: {exc}")
        return
    if tok.pad_token_id is None:
        errors.append(f"the tokenizer at {tokenizer_path!r} has no pad token; set one (e.g. "
                      f"tokenizer.pad_token = tokenizer.eos_token) and save it, or pass tokenizer_config['path']")
    if tok.eos_token_id is None:
        errors.append(f"the tokenizer at {tokenizer_path!r} has no EOS token; responses could never end")


def build_models(errors: List[str], roles: Roles, imc: Dict[str, Any], tmc: Dict[str, Any], tokc: Dict[str, Any],
                 critic_cfg: Dict[str, Any], rm_cfg: Dict[str, Any], core_algo: str,
                 needs_critic: Optional[bool]) -> Models:
    """needs_critic: whether the algorithm trains a critic (None: the algorithm is unknown)."""
    resolved: Dict[str, str] = {}  # path or Hub ID as given -> local directory
    model_path = _model_path(errors, "inference_model_config", imc, resolved)
    train_path = _model_path(errors, "train_model_config", tmc, resolved) if tmc.get("path") else model_path
    if model_path and train_path and Path(model_path).resolve() != Path(train_path).resolve():
        log.info("producers generate from %s, consumers train %s", model_path, train_path)
    tokenizer_path = model_path
    if tokc.get("path"):
        tokenizer_path = _local(errors, "tokenizer_config['path']", str(tokc["path"]), resolved) or ""
    _check_tokenizer(errors, tokenizer_path)
    rm_path = _model_path(errors, "reward_model_config", rm_cfg, resolved) if rm_cfg else None
    critic_path = _model_path(errors, "critic_model_config", critic_cfg, resolved) if critic_cfg else None
    if needs_critic and critic_path is None:
        critic_path = train_path  # value head on a copy of the policy's trunk
    if critic_cfg and needs_critic is False:
        errors.append(f"critic_model_config is only used by algorithms with a critic (PPO), not {core_algo!r}; "
                      f"drop it")
    engine_kwargs = check_inference_config(errors, roles.inference_backend, imc, roles.num_proc_per_producer)
    return Models(model_path=model_path, train_path=train_path, tokenizer_path=tokenizer_path,
                  inference_model_kwargs=engine_kwargs, lora=_lora(errors, tmc.get("lora")),
                  critic_model_path=critic_path, reward_model_path=rm_path,
                  gradient_checkpointing=_flag_key(errors, "train_model_config", "gradient_checkpointing", tmc))


def _flag_key(errors: List[str], section: str, key: str, cfg: Dict[str, Any]) -> bool:
    value = cfg.get(key, False)
    if not isinstance(value, bool):
        errors.append(f"{section}[{key!r}] must be True or False, got {value!r}")
        return False
    return value


def _lora(errors: List[str], lora: Any) -> Optional[Dict[str, Any]]:
    """train_model_config['lora']: None (full training) or {"r": rank, "alpha", "target_modules", "dropout"}."""
    if lora is None:
        return None
    if not isinstance(lora, dict) or "r" not in lora or set(lora) - set(LORA_KEYS):
        errors.append(f"train_model_config['lora'] must be None (full training) or a dict with 'r' and optionally "
                      f"{list(LORA_KEYS[1:])}, got {lora!r}")
        return None
    checks = {"r": (lambda v: is_int(v) and v > 0, "an int > 0 (the rank; None for full training)"),
              "alpha": (lambda v: is_number(v) and v > 0, "a number > 0"),
              "dropout": (lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
              "target_modules": (lambda v: v is None or isinstance(v, str) or (
                  isinstance(v, (list, tuple)) and v and all(isinstance(m, str) and m for m in v)),
                  "None (peft's default), a module name or a non-empty list of module names")}
    for key, value in lora.items():
        ok, expect = checks[key]
        if not ok(value):
            errors.append(f"train_model_config['lora'][{key!r}] must be {expect}, got {value!r}")
    return dict(lora)
