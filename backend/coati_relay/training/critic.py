"""The PPO critic: a transformers base model with a linear value head on every position."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Union

import torch
import torch.nn as nn

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.pt"


class _NoLoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


def _load_trunk(path: Path, dtype: torch.dtype) -> nn.Module:
    """The base model of ``path`` (a causal LM's checkpoint, as a rule). Its LM head is the one key the trunk does not
    take, which transformers' load report shows as a table on every load; only other differences are said, in one
    warning."""
    from transformers import AutoModel

    report_logger = logging.getLogger("transformers.modeling_utils")
    quiet = _NoLoadReport()
    report_logger.addFilter(quiet)
    try:
        base, info = AutoModel.from_pretrained(path, dtype=dtype, output_loading_info=True)
    finally:
        report_logger.removeFilter(quiet)
    missing = list(info.get("missing_keys") or [])
    unexpected = [k for k in info.get("unexpected_keys") or [] if not k.startswith("lm_head.")]
    mismatched = list(info.get("mismatched_keys") or [])
    if missing or unexpected or mismatched:
        logger.warning("critic base model from %s: missing %s, unexpected %s, mismatched %s (freshly initialised "
                       "where missing)", path, missing[:8], unexpected[:8], mismatched[:8])
    return base


class CriticModel(nn.Module):
    """values[n, s] = value_head(base(input_ids, attention_mask).last_hidden_state[n, s]).

    base: a transformers base model (no LM head), e.g. ``AutoModel`` of a causal-LM checkpoint.
    value_head: ``nn.Linear(hidden_size, 1)``.
    """

    def __init__(self, base: nn.Module, value_head: nn.Linear) -> None:
        super().__init__()
        if not isinstance(value_head, nn.Linear) or value_head.out_features != 1:
            raise TypeError(f"CriticModel: value_head must be nn.Linear(hidden, 1), got {value_head!r}")
        self.base = base
        self.value_head = value_head

    @classmethod
    def from_pretrained(cls, path: Union[str, os.PathLike], dtype: torch.dtype = torch.float32,
                        seed: int = 0) -> "CriticModel":
        """Loads the base model from ``path``; the value head from ``path/value_head.pt`` when a critic was saved
        there, else a fresh head initialised from ``seed`` (the same head on every rank)."""
        path = Path(path)
        if not (path / "config.json").is_file():
            raise ValueError(f"CriticModel.from_pretrained: {path} holds no config.json; "
                             "pass a directory written by save_pretrained of a transformers model")
        base = _load_trunk(path, dtype)
        hidden = base.config.hidden_size
        head = nn.Linear(hidden, 1, dtype=dtype)
        head_file = path / VALUE_HEAD_FILE
        if head_file.is_file():
            head.load_state_dict(torch.load(head_file, map_location="cpu", weights_only=True))
        else:
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                head.weight.normal_(0.0, 1.0 / (hidden + 1), generator=gen)
                head.bias.zero_()
            logger.info("critic value head of %s initialised fresh (seed %d)", path, seed)
        return cls(base, head)

    def save_pretrained(self, path: Union[str, os.PathLike]) -> None:
        """Writes the base model (transformers layout) and ``value_head.pt``; `from_pretrained` reads both."""
        path = Path(path)
        self.base.save_pretrained(path)
        torch.save(self.value_head.state_dict(), path / VALUE_HEAD_FILE)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: LongTensor [N, S] -> values FloatTensor [N, S] (float32).

        Positions count real tokens only (left padding does not shift them), as in generation.
        """
        if input_ids.shape != attention_mask.shape:
            raise ValueError(f"CriticModel: input_ids {tuple(input_ids.shape)} and attention_mask "
                             f"{tuple(attention_mask.shape)} must have the same shape [N, S]")
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.base(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids).last_hidden_state
        return self.value_head(hidden).squeeze(-1).float()
