"""A module held in memory as an inference engine takes it: its weights with LoRA layers folded (`module_weights`),
and for an engine that starts only from a checkpoint directory (vLLM), ``config.json`` and ``model.safetensors``
(`write_module_checkpoint`; no tokenizer: the engine is given token ids)."""
from __future__ import annotations

import json
import os
from typing import Dict, Iterable, Optional

import torch

from coati_relay.exchange.lora_deltas import merge_lora

_ADAPTER_KEYS = ("lora_A", "lora_B")


@torch.no_grad()
def module_weights(model: torch.nn.Module, names: Optional[Iterable[str]] = None) -> Dict[str, torch.Tensor]:
    """``model``'s state dict (HF names, no copies where nothing is folded) as an engine holds it: each LoRA layer of
    the loralib form (a module with tensors ``lora_A`` [r, in] and ``lora_B`` [out, r] and a ``scaling``, whose
    ``weight`` [out, in] is W0; ``fan_in_fan_out`` layers store W0 as [in, out]) folded into ``W0 + scaling * B @ A``
    in its stored layout, the adapter tensors left out. With ``names`` (state-dict keys, e.g. those a push just
    loaded): only those, and the folded weight of each LoRA layer one of them belongs to."""
    state, names = model.state_dict(), None if names is None else list(names)
    keys = [k for k in (state if names is None else names) if k in state and not k.endswith(_ADAPTER_KEYS)]
    adapters = {}
    for name, layer in model.named_modules():
        a, b = getattr(layer, "lora_A", None), getattr(layer, "lora_B", None)
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and hasattr(layer, "scaling")):
            continue
        if names is None or any(k.startswith(f"{name}.") for k in names):
            transposed = getattr(layer, "fan_in_fan_out", False)  # (B @ A)^T = A^T @ B^T
            adapters[f"{name}.weight"] = (b.T, a.T, layer.scaling) if transposed else (a, b, layer.scaling)
    return {**{k: state[k] for k in keys}, **merge_lora(state, adapters)}


def write_module_checkpoint(model: torch.nn.Module, weights: Dict[str, torch.Tensor], directory: str) -> None:
    """Writes ``model``'s config and ``weights`` (HF name -> tensor, e.g. its state dict with LoRA layers folded) to
    ``directory``, from this process whatever its rank (``save_pretrained`` writes on rank 0 only).

    ``architectures`` names ``model``'s class: a model built from a config may name none, and vLLM then serves it as
    a pooling model.
    """
    from safetensors.torch import save_file

    config = json.loads(model.config.to_json_string(use_diff=False))
    config["architectures"] = [type(model).__name__]
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    # copies: safetensors refuses tensors that share memory (tied embeddings); freed once written
    save_file({k: v.detach().cpu().clone() for k, v in weights.items()}, os.path.join(directory, "model.safetensors"))
