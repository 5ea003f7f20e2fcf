"""The unit of data between producers and consumers.

A `Rollout` holds ``N = num_prompts * group_size`` sampled sequences, prompt-major: rows ``i*G .. i*G+G-1`` are the
``G`` responses to prompt ``i``. Prompts are left-padded, responses right-padded, so that
``sequences = cat(prompt_ids, response_ids)`` lines every response up at the same column.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from coati_relay.exchange.wire import unwired, wired_fields

# Tensor fields whose second dimension is the response length; they are right-padded when rollouts are joined.
_RESPONSE_FIELDS = ("response_ids", "response_mask", "logprobs")
_PROMPT_FIELDS = ("prompt_ids", "prompt_mask")
_ROW_FIELDS = ("response_lengths", "rewards", "format_acc", "ans_acc")
_TENSOR_FIELDS = _PROMPT_FIELDS + _RESPONSE_FIELDS + _ROW_FIELDS


@dataclass
class Rollout:
    """A batch of sampled responses.

    prompt_ids:       LongTensor [N, P], left-padded with the pad id.
    prompt_mask:      LongTensor [N, P], 1 on real prompt tokens.
    response_ids:     LongTensor [N, R], right-padded with the pad id.
    response_mask:    BoolTensor [N, R], True on generated tokens up to and including the first EOS.
    logprobs:         FloatTensor [N, R], behaviour-policy log-probs of ``response_ids``; 0 on padding.
    response_lengths: LongTensor [N], number of True entries of ``response_mask`` per row.
    group_size:       G, responses per prompt.
    weight_version:   version of the weights that generated this rollout (-1: unknown).
    rewards:          FloatTensor [N] or None, scalar reward per response.
    format_acc:       FloatTensor [N] or None, 1.0 where a rule reward found the response's format valid.
    ans_acc:          FloatTensor [N] or None, 1.0 where a rule reward found the answer correct (``filter_range``
                      compares a group's mean of it; None: the reward stands in for it).
    info:             per-prompt metadata (e.g. ``gt_answer``), each a list of length N / G.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    response_lengths: torch.Tensor
    group_size: int = 1
    weight_version: int = -1
    rewards: Optional[torch.Tensor] = None
    info: Dict[str, List[Any]] = field(default_factory=dict)
    format_acc: Optional[torch.Tensor] = None
    ans_acc: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        n = self.prompt_ids.size(0)
        for name in _TENSOR_FIELDS:
            t = getattr(self, name)
            if t is not None and t.size(0) != n:
                raise ValueError(f"Rollout.{name} has {t.size(0)} rows, expected {n} (rows of prompt_ids)")
        if n % self.group_size:
            raise ValueError(f"Rollout has {n} rows, not a multiple of group_size={self.group_size}")

    @property
    def num_sequences(self) -> int:
        return self.prompt_ids.size(0)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors (the payload a producer sends)."""
        return sum(t.numel() * t.element_size() for name in _TENSOR_FIELDS if (t := getattr(self, name)) is not None)

    def __reduce__(self):
        """Pickled with its tensors as numpy arrays (`coati_relay.exchange.wire`: torch's own pickling leaves cyclic
        garbage per tensor); it arrives with them on the CPU."""
        return _rollout_from_wire, (wired_fields(self),)

    @property
    def num_prompts(self) -> int:
        return self.num_sequences // self.group_size

    @property
    def sequences(self) -> torch.Tensor:
        """LongTensor [N, P + R]."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """LongTensor [N, P + R]: prompt mask then response mask."""
        return torch.cat([self.prompt_mask.long(), self.response_mask.long()], dim=1)

    def take_groups(self, groups: Sequence[int]) -> "Rollout":
        """The rollout of the prompts ``groups`` (indices into the ``num_prompts`` groups), in that order."""
        g = self.group_size
        idx = torch.tensor([i * g + j for i in groups for j in range(g)], dtype=torch.long)
        out: Dict[str, Any] = {name: None if getattr(self, name) is None else getattr(self, name)[idx.to(
            getattr(self, name).device)] for name in _TENSOR_FIELDS}
        out["info"] = {k: [v[i] for i in groups] for k, v in self.info.items()}
        return Rollout(group_size=g, weight_version=self.weight_version, **out)

    @staticmethod
    def concat(parts: Sequence["Rollout"], pad_token_id: int) -> "Rollout":
        """Join rollouts of one group size: prompts left-padded and responses right-padded to the longest."""
        if not parts:
            raise ValueError("Rollout.concat needs at least one rollout")
        g = parts[0].group_size
        if any(p.group_size != g for p in parts):
            raise ValueError(f"Rollout.concat: group sizes differ: {[p.group_size for p in parts]}")
        out: Dict[str, Any] = {}
        p_len = max(p.prompt_ids.size(1) for p in parts)
        r_len = max(p.response_ids.size(1) for p in parts)
        for name in _PROMPT_FIELDS:
            pad = pad_token_id if name == "prompt_ids" else 0
            out[name] = torch.cat([F.pad(getattr(p, name), (p_len - getattr(p, name).size(1), 0), value=pad)
                                   for p in parts])
        for name in _RESPONSE_FIELDS:
            ts = [getattr(p, name) for p in parts]
            if any(t is None for t in ts):
                if any(t is not None for t in ts):
                    raise ValueError(f"Rollout.concat: {name} is set on some rollouts only")
                out[name] = None
                continue
            pad = pad_token_id if name == "response_ids" else 0
            out[name] = torch.cat([F.pad(t, (0, r_len - t.size(1)), value=pad) for t in ts])
        for name in _ROW_FIELDS:
            ts = [getattr(p, name) for p in parts]
            out[name] = None if any(t is None for t in ts) else torch.cat(ts)
        keys = set().union(*(p.info.keys() for p in parts))
        out["info"] = {k: [x for p in parts for x in p.info.get(k, [None] * p.num_prompts)] for k in keys}
        versions = {p.weight_version for p in parts}
        out["weight_version"] = min(versions)
        return Rollout(group_size=g, **out)


def _rollout_from_wire(state: Dict[str, Any]) -> Rollout:
    """The `Rollout` of `Rollout.__reduce__`'s state."""
    return Rollout(**unwired(state))


def response_mask(response_ids: torch.Tensor, stop_ids: Sequence[int],
                  lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
    """BoolTensor [N, R]: True up to and including the first stop token, and below ``lengths`` when given.

    The one "mask through the first EOS" of the project (engine backends and the legacy sampler).
    response_ids: LongTensor [N, R]; stop_ids: the ids that end a response (empty: none does);
    lengths: LongTensor [N] of generated tokens per row (None: all R).
    """
    n, r = response_ids.shape
    mask = torch.ones(n, r, dtype=torch.bool, device=response_ids.device)
    if lengths is not None:
        mask &= torch.arange(r, device=response_ids.device).expand(n, r) < lengths.unsqueeze(1)
    if stop_ids:
        is_stop = torch.isin(response_ids, torch.tensor(list(stop_ids), device=response_ids.device)) & mask
        mask &= (is_stop.long().cumsum(dim=1) - is_stop.long()) == 0  # the stop token itself stays
    return mask
