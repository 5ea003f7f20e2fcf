"""Dropout off in the models a run trains (`coati_relay.roles.learner.Learner`), as TRL does by default.

A policy trained with dropout on takes its old log-probs in eval mode and its new ones in train mode, so the first
ratio of an unchanged policy is not 1: a GPT-2-shaped model (dropout 0.1) reported a KL of 0.005 at PPO's first step,
and the clip acted on that noise. With dropout off, train and eval forwards agree and that step's KL is 0.
"""
from __future__ import annotations

from torch import nn

# float attributes that transformers' attention modules read as their dropout probability in train mode
# (Llama/Qwen2 ``attention_dropout``; OPT/BART-style ``dropout``)
FLOAT_DROPOUT_ATTRS = ("attention_dropout", "dropout")


def disable_dropout(model: nn.Module) -> int:
    """Sets every dropout probability of ``model`` to 0: each ``nn.Dropout``'s ``p`` and the float attributes
    `FLOAT_DROPOUT_ATTRS` of its modules. LoRA's own dropout (peft's ``lora_dropout``, set by the run's ``lora``
    keys) is left as given. The model's config is not changed, so a saved or exported model keeps its dropout.
    Returns how many probabilities were non-zero."""
    changed = 0
    for name, module in model.named_modules():
        if "lora_dropout" in name:
            continue
        if isinstance(module, nn.modules.dropout._DropoutNd):
            changed += module.p > 0
            module.p = 0.0
        for attr in FLOAT_DROPOUT_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, float):
                changed += value > 0
                setattr(module, attr, 0.0)
    return changed
