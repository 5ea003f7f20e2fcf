"""`coati-relay export RUN_DIR_OR_CHECKPOINT OUT_DIR`: a run's trained policy as a Hugging Face model directory
(``save_pretrained``: ``config.json``, safetensors weights, the tokenizer), which ``AutoModelForCausalLM`` and vLLM
load as they are.

What it reads (`coati_relay.checkpoint`): ``RUN/checkpoints/step-NNNNNN/policy/`` of the latest complete checkpoint of
a run directory, or of the step directory given. The weights are ``model.pt``: one file holding the complete state
dict (every plugin: ZeRO and Gemini gather it when the run saves), or a sharded directory (ColossalAI's layout: an
``*.index.json`` naming the shard of every tensor), read here shard by shard. The architecture comes from the
``config.json`` the run saved beside the weights, and the tokenizer from the model directory the run trained
(``source.json``); checkpoints written before the run saved them need ``--model MODEL_DIR``.

A LoRA run's checkpoint holds the base weights and the adapters: the export folds the adapters in (W + scale·B·A,
the weights the producers generated with), or with ``adapter=True`` writes the adapters alone as a peft directory
(``adapter_config.json``, ``adapter_model.safetensors``) on top of the run's base model.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Union

from coati_relay.checkpoint import CHECKPOINTS_DIR, STATE_FILE, resolve_checkpoint
from coati_relay.training.booster_backend import MODEL_FILE
from coati_relay.training.model_description import ADAPTER_CONFIG_FILE, CONFIG_FILE, SOURCE_FILE

POLICY = "policy"
EXPORT_FILE = "coati_relay_export.json"  # where an export came from: the checkpoint, its step, merged or adapter
_DTYPES = ("float32", "bfloat16", "float16")
PathLike = Union[str, os.PathLike]


class ExportError(ValueError):
    """A path or option the export cannot use; the message says what was expected."""


def find_policy(source: PathLike) -> Path:
    """The policy directory of ``source``: a run directory (its latest complete checkpoint), a step directory, or
    the policy directory itself."""
    path = Path(source)
    if not path.exists():
        raise ExportError(f"{path} does not exist; pass a run directory (holding {CHECKPOINTS_DIR}/step-NNNNNN/) or "
                          f"one checkpoint (a step-NNNNNN directory holding {STATE_FILE} and {POLICY}/{MODEL_FILE})")
    if path.name == POLICY and (path / MODEL_FILE).exists():
        return path
    if not (path / STATE_FILE).is_file() and not (path / CHECKPOINTS_DIR).is_dir():
        raise ExportError(f"{path} is neither a run directory (no {CHECKPOINTS_DIR}/ in it) nor a checkpoint (no "
                          f"{STATE_FILE} in it); pass a run's directory (its run_dir) or one of its "
                          f"{CHECKPOINTS_DIR}/step-NNNNNN directories")
    try:
        step_dir = resolve_checkpoint(path)
    except FileNotFoundError as exc:
        raise ExportError(str(exc)) from exc
    policy = step_dir / POLICY
    if not (policy / MODEL_FILE).exists():
        present = sorted(p.name for p in step_dir.iterdir())
        raise ExportError(f"checkpoint {step_dir} holds no {POLICY}/{MODEL_FILE} (it holds {present}); a run's "
                          "checkpoint keeps the trained policy there")
    return policy


def read_weights(model_path: PathLike) -> Dict[str, Any]:
    """The complete state dict in ``model.pt``: one file, or a sharded directory whose ``*.index.json`` maps each
    tensor to its shard (``.safetensors`` or a torch file)."""
    import torch

    path = Path(model_path)
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    indexes = sorted(path.glob("*.index.json"))
    if len(indexes) != 1:
        raise ExportError(f"{path} is a directory but not one sharded checkpoint: expected one *.index.json in it, "
                          f"found {[p.name for p in indexes]}")
    weight_map = json.loads(indexes[0].read_text()).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ExportError(f"{indexes[0]} has no weight_map (tensor name -> shard file); is it a model checkpoint?")
    state: Dict[str, Any] = {}
    for shard in sorted(set(weight_map.values())):
        if shard.endswith(".safetensors"):
            from safetensors.torch import load_file

            state.update(load_file(str(path / shard)))
        else:
            state.update(torch.load(path / shard, map_location="cpu", weights_only=True))
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise ExportError(f"{path}: the shards lack {len(missing)} tensor(s) the index names, e.g. {missing[:3]}")
    return state


def _model_dir(policy: Path, model: Optional[PathLike]) -> Optional[Path]:
    """The model directory the run trained: ``model`` where given, else the one the checkpoint recorded."""
    if model is not None:
        if not (Path(model) / CONFIG_FILE).is_file():
            raise ExportError(f"--model {model} holds no {CONFIG_FILE}; pass the model directory the run trained")
        return Path(model)
    if (policy / SOURCE_FILE).is_file():
        recorded = json.loads((policy / SOURCE_FILE).read_text()).get("model_path")
        if recorded and Path(recorded).is_dir():
            return Path(recorded)
    return None


def _config(policy: Path, model_dir: Optional[Path]):
    from transformers import AutoConfig

    if (policy / CONFIG_FILE).is_file():
        return AutoConfig.from_pretrained(policy)
    if model_dir is None:
        raise ExportError(f"checkpoint {policy} holds no {CONFIG_FILE} (it was written before runs saved one): pass "
                          "--model MODEL_DIR, the model directory the run trained, for its architecture and tokenizer")
    return AutoConfig.from_pretrained(model_dir)


def _tokenizer(policy: Path, model_dir: Optional[Path], tokenizer: Optional[PathLike]):
    from transformers import AutoTokenizer

    where = Path(tokenizer) if tokenizer is not None else model_dir
    if where is None:
        recorded = json.loads((policy / SOURCE_FILE).read_text()).get("model_path") \
            if (policy / SOURCE_FILE).is_file() else None
        raise ExportError(f"no tokenizer for {policy}: the run's model directory ({recorded or 'not recorded'}) is "
                          "not here; pass --tokenizer DIR (or --model MODEL_DIR)")
    try:
        return AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot load a tokenizer from {where}: {exc}; pass --tokenizer DIR") from exc


def _lora_model(config: Any, policy: Path, state: Dict[str, Any]):
    """A peft model of the architecture ``config`` holding the checkpoint's base weights and adapters."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if not (policy / ADAPTER_CONFIG_FILE).is_file():
        raise ExportError(f"{policy}/{MODEL_FILE} holds LoRA adapters but the checkpoint has no {ADAPTER_CONFIG_FILE} "
                          "(their rank, alpha and target modules); it was written before runs saved one")
    adapter = LoraConfig.from_pretrained(str(policy))
    peft_model = get_peft_model(AutoModelForCausalLM.from_config(config), adapter)
    wanted = peft_model.state_dict()
    found, missing = {}, []
    for key in wanted:
        name = next((n for n in _lora_key_forms(key) if n in state), None)
        if name is None:
            missing.append(key)
        else:
            found[key] = state.pop(name)
    if missing or state:
        raise ExportError(f"{policy}/{MODEL_FILE} does not fit its LoRA model: missing {missing[:3]}, unexpected "
                          f"{sorted(state)[:3]}")
    peft_model.load_state_dict(found, strict=True)
    return peft_model


def _lora_key_forms(key: str):
    """The names a peft model's tensor ``key`` has in the checkpoints of this engine: the peft model's own (no
    booster), or the booster's, which saves the model inside peft's wrapper with each wrapped layer's weight under
    its base name (``q_proj.weight`` for ``q_proj.base_layer.weight``)."""
    inner = key[len("base_model.model."):] if key.startswith("base_model.model.") else key
    return (key, inner, inner.replace(".base_layer.", "."))


def _strip_wrapper_prefix(state: Dict[str, Any]) -> Dict[str, Any]:
    if state and all(k.startswith("module.") for k in state):  # saved through a DDP wrapper
        return {k[len("module."):]: v for k, v in state.items()}
    return state


def _cast(model: Any, dtype: Optional[str]) -> None:
    if dtype is None:
        return
    import torch

    if dtype not in _DTYPES:
        raise ExportError(f"dtype must be one of {list(_DTYPES)}, got {dtype!r}")
    model.to(getattr(torch, dtype))


def export_checkpoint(source: PathLike, out_dir: PathLike, adapter: bool = False, model: Optional[PathLike] = None,
                      tokenizer: Optional[PathLike] = None, dtype: Optional[str] = None) -> Path:
    """Writes the policy of ``source`` (a run directory or one checkpoint) to ``out_dir`` as a Hugging Face model
    directory and returns ``out_dir``. ``adapter``: a LoRA run's adapters alone (peft's layout), not merged weights.
    ``model``/``tokenizer``: the run's model directory / a tokenizer directory, where the checkpoint's record does
    not reach. ``dtype``: cast the weights (``float32``, ``bfloat16``, ``float16``); default: as trained."""
    from transformers import AutoModelForCausalLM

    from coati_relay.training.booster_backend import _merged_lora_state_dict

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty directory; pass a new directory to export into")
    policy = find_policy(source)
    model_dir = _model_dir(policy, model)
    config = _config(policy, model_dir)
    tok = _tokenizer(policy, model_dir, tokenizer)
    state = _strip_wrapper_prefix(read_weights(policy / MODEL_FILE))
    is_lora = any(".lora_A." in k for k in state)
    if adapter and not is_lora:
        raise ExportError(f"--adapter: {policy}/{MODEL_FILE} holds no LoRA adapters (the run trained every weight); "
                          "export without --adapter")
    if is_lora:
        peft_model = _lora_model(config, policy, state)
        if adapter:
            peft_model.peft_config[peft_model.active_adapter].base_model_name_or_path = \
                str(model_dir.resolve()) if model_dir is not None else None
            _cast(peft_model, dtype)
            peft_model.save_pretrained(out)
        else:
            merged = AutoModelForCausalLM.from_config(config)
            merged.load_state_dict(_merged_lora_state_dict(peft_model), strict=True)
            _cast(merged, dtype)
            merged.save_pretrained(out)
    else:
        hf_model = AutoModelForCausalLM.from_config(config)
        result = hf_model.load_state_dict(state, strict=False)
        tied = set(getattr(hf_model, "_tied_weights_keys", None) or ())
        missing = [k for k in result.missing_keys if k not in tied]
        if missing or result.unexpected_keys:
            raise ExportError(f"{policy}/{MODEL_FILE} does not fit the architecture of its {CONFIG_FILE} "
                              f"({type(hf_model).__name__}): missing {missing[:3]}, unexpected "
                              f"{result.unexpected_keys[:3]}")
        _cast(hf_model, dtype)
        hf_model.save_pretrained(out)
    tok.save_pretrained(out)
    step_dir = policy.parent
    step = json.loads((step_dir / STATE_FILE).read_text()).get("step") if (step_dir / STATE_FILE).is_file() else None
    (out / EXPORT_FILE).write_text(json.dumps({"checkpoint": str(step_dir.resolve()), "step": step,
                                               "form": "adapter" if adapter else "merged" if is_lora else "full",
                                               "model_path": str(model_dir.resolve()) if model_dir else None},
                                              indent=1))
    return out
