"""What `TrainingBackend.save` records beside the weights of a transformers model, for `coati_relay.export`: its
config (``config.json``), its LoRA config (``adapter_config.json``, a peft model) and the directory it was loaded from
(``source.json``; its tokenizer is there by default)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from torch import nn

CONFIG_FILE, ADAPTER_CONFIG_FILE, SOURCE_FILE = "config.json", "adapter_config.json", "source.json"


def is_peft(module: nn.Module) -> bool:
    """Whether ``module`` is a peft model (LoRA adapters around a base model)."""
    return type(module).__module__.startswith("peft.") and hasattr(module, "get_base_model")


def save_description(module: nn.Module, directory: Path) -> None:
    """Writes the three files for ``module`` (unwrapped; a peft model or a plain transformers model) into
    ``directory``: what an export rebuilds the model from. A module without a transformers config gets none."""
    peft = is_peft(module)
    base = module.get_base_model() if peft else module
    config = getattr(base, "config", None)
    if config is None or not hasattr(config, "to_json_file"):
        return
    config.to_json_file(str(directory / CONFIG_FILE))
    if peft:
        adapter = module.peft_config[module.active_adapter]
        (directory / ADAPTER_CONFIG_FILE).write_text(json.dumps(adapter.to_dict(), indent=2, sort_keys=True,
                                                                default=sorted))
    source = getattr(config, "_name_or_path", "") or ""
    if source and os.path.isdir(source):
        source = os.path.abspath(source)
    (directory / SOURCE_FILE).write_text(json.dumps({"model_path": source or None}))
