"""Legacy ``Experience`` (``coati.experience_maker``) and ``coati.experience_buffer.utils``
(``coati.replay_buffer.utils`` in the reference version): ``BufferItem``, ``split_experience_batch``,
``zero_pad_sequences`` and ``make_experience_batch``.

Shapes: B samples, S tokens per sequence, A action tokens. ``advantages`` is [B,1] as the maker produces it.
Merging keeps the legacy rules: ``action_log_probs`` and ``action_mask`` are zero-padded on the *left* to the
longest item (False for the bool mask); every other field is stacked without padding, so sequences of different
lengths are an error (raised here as a ValueError that says so, where the legacy code let ``torch.stack`` fail).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import List, Optional

import torch
from torch.nn.utils.rnn import pad_sequence

from coati_compat.imports.deprecations import deprecated_api
from coati_relay.parts import unwired, wired_fields

KEYS = ("sequences", "action_log_probs", "values", "reward", "advantages", "attention_mask", "action_mask")
_LEFT_PADDED = ("action_log_probs", "action_mask")


class _TensorsAsArrays:
    """Pickles a dataclass with its tensors as numpy arrays (the engine's `wired_fields`), as they cross Ray between
    a maker and a trainer: torch's own pickling of a tensor defines a class per call, cyclic garbage that only a full
    collection frees, and takes about 6x as long (1.1 ms against 0.18 for a 7-tensor item). Tensors arrive on the
    CPU, where the maker puts them before sending."""

    def __reduce__(self):
        return _from_arrays, (type(self), wired_fields(self))


def _from_arrays(cls: type, state: dict):
    return cls(**unwired(state))


@deprecated_api("coati.experience_maker.Experience")
@dataclass
class Experience(_TensorsAsArrays):
    """A batch of experience. sequences [B,S]; action_log_probs [B,A]; values [B]; reward [B]; advantages [B,1];
    attention_mask [B,S] (long) or None; action_mask [B,A] (bool) or None."""

    sequences: torch.Tensor
    action_log_probs: torch.Tensor
    values: torch.Tensor
    reward: torch.Tensor
    advantages: torch.Tensor
    attention_mask: Optional[torch.LongTensor]
    action_mask: Optional[torch.BoolTensor]

    @torch.no_grad()
    def to_device(self, device: torch.device | str) -> None:
        """Moves every tensor to ``device`` in place (None masks stay None)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                setattr(self, f.name, value.to(device))

    def pin_memory(self) -> "Experience":
        """Pins every tensor (for ``DataLoader(pin_memory=True)``) and returns self."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                setattr(self, f.name, value.pin_memory())
        return self


@deprecated_api("coati.experience_buffer.utils.BufferItem")
@dataclass
class BufferItem(_TensorsAsArrays):
    """One sample of an ``Experience``: sequences [S]; action_log_probs [A]; values []; reward []; advantages [1];
    attention_mask [S] or None; action_mask [A] or None."""

    sequences: torch.Tensor
    action_log_probs: torch.Tensor
    values: torch.Tensor
    reward: torch.Tensor
    advantages: torch.Tensor
    attention_mask: Optional[torch.LongTensor]
    action_mask: Optional[torch.BoolTensor]


@deprecated_api("coati.experience_buffer.utils.split_experience_batch")
def split_experience_batch(experience: Experience) -> List[BufferItem]:
    """One ``BufferItem`` per sample (the rows along dim 0); a None field is None in every item.

    Each row is copied into a storage of its own (the legacy ``torch.unbind`` gave views): a view pickles its whole
    batch's storage, so the items of one ``buffer_extend`` call carried the batch once per item to the trainer."""
    batch_size = experience.sequences.size(0)
    columns = {}
    for key in KEYS:
        value = getattr(experience, key)
        if value is None:
            columns[key] = [None] * batch_size
            continue
        columns[key] = [row.clone() for row in torch.unbind(value)]
        if len(columns[key]) != batch_size:
            raise ValueError(f"Experience.{key} has {len(columns[key])} rows, sequences has {batch_size}; every "
                             "field must have the batch size as its first dimension")
    return [BufferItem(**{key: columns[key][i] for key in KEYS}) for i in range(batch_size)]


@deprecated_api("coati.experience_buffer.utils.zero_pad_sequences")
def zero_pad_sequences(sequences: List[torch.Tensor], side: str = "left") -> torch.Tensor:
    """Zero-pads 1-D tensors on ``side`` (left | right) to the longest and stacks them: [N, max_len]."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if side == "right":
        return pad_sequence(list(sequences), batch_first=True, padding_value=0)
    flipped = pad_sequence([t.flip(0) for t in sequences], batch_first=True, padding_value=0)
    return flipped.flip(1)


def _stack(key: str, values: List[Optional[torch.Tensor]]) -> Optional[torch.Tensor]:
    present = [v is not None for v in values]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"make_experience_batch: {key} is None in some items only; give it to all or none")
    if key in _LEFT_PADDED:
        return zero_pad_sequences(values)
    shapes = {tuple(v.shape) for v in values}
    if len(shapes) > 1:
        raise ValueError(f"make_experience_batch: items have {key} of shapes {sorted(shapes)}; the legacy batching "
                         f"stacks {key} without padding, so all items of a batch need one sequence length (generate "
                         "with early_stopping=False and the same max_length on every maker)")
    return torch.stack(values)


@deprecated_api("coati.experience_buffer.utils.make_experience_batch")
def make_experience_batch(items: List[BufferItem]) -> Experience:
    """Merges items into one ``Experience``: log-probs and action mask left-padded, the rest stacked."""
    if not items:
        raise ValueError("make_experience_batch needs at least one BufferItem")
    return Experience(**{key: _stack(key, [getattr(item, key) for item in items]) for key in KEYS})
