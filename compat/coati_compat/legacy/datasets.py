"""Legacy ``coati.dataset`` (final release, ColossalAI ``be400a093``): the prompt, reward-model and supervised
datasets of ColossalChat's 2023 training scripts, as plain tokenisation.

- ``PromptDataset(data_path, tokenizer, max_datasets_size=None, max_length=96)``: the ``instruction`` of each record
  of a JSON list, tokenised to ``max_length`` (padded, truncated); samples ``{"input_ids", "attention_mask"}``
  [max_length] on the compute device.
- ``RmStaticDataset`` (records ``prompt`` / ``chosen`` / ``rejected``, as Dahoas/rm-static) and ``HhRlhfDataset``
  (records ``chosen`` / ``rejected``, as Anthropic/hh-rlhf): each text plus the end token (``special_token``, default
  the tokenizer's EOS) tokenised to ``max_length``; samples ``(chosen_ids, chosen_mask, rejected_ids,
  rejected_mask)``, each [max_length].
- ``SFTDataset``, ``SupervisedDataset``, ``IGNORE_INDEX``: `coati_compat.legacy.sft_datasets`.
- ``is_rank_0()``: True outside a process group and on rank 0.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.sft_datasets import (
    IGNORE_INDEX,
    PROMPT_DICT,
    SFTDataset,
    SupervisedDataset,
    check_max_length,
    eos_text,
    jload,
)
from coati_relay.parts import accelerator_device

logger = logging.getLogger(__name__)

__all__ = ["PromptDataset", "RmStaticDataset", "HhRlhfDataset", "SFTDataset", "SupervisedDataset", "IGNORE_INDEX",
           "PROMPT_DICT", "is_rank_0", "jload"]


@deprecated_api("coati.dataset.is_rank_0")
def is_rank_0() -> bool:
    """True outside a process group and on its rank 0."""
    return not dist.is_initialized() or dist.get_rank() == 0


def _tokens(tokenizer: Any, texts: List[str], max_length: int) -> Dict[str, torch.Tensor]:
    return tokenizer(texts, max_length=max_length, padding="max_length", truncation=True, return_tensors="pt")


@deprecated_api("coati.dataset.PromptDataset")
class PromptDataset(Dataset):
    """Prompts of a JSON list of records with ``instruction`` (see the module docstring)."""

    def __init__(self, data_path: str, tokenizer: Any, max_datasets_size: Optional[int] = None,
                 max_length: int = 96) -> None:
        super().__init__()
        records = jload(data_path)
        logger.info("loaded %d prompts from %s", len(records), data_path)
        if max_datasets_size is not None:
            records = records[:max_datasets_size]
        missing = [i for i, r in enumerate(records) if "instruction" not in r]
        if missing:
            raise ValueError(f"PromptDataset({data_path!r}): records {missing[:5]} have no 'instruction'")
        tokens = _tokens(tokenizer, [r["instruction"] for r in records], check_max_length(max_length))
        device = accelerator_device()
        self.keyed_prompt: Dict[str, Tuple[torch.Tensor, ...]] = {
            key: tensor.to(device).unbind() for key, tensor in tokens.items()}

    def __len__(self) -> int:
        return len(self.keyed_prompt["input_ids"])

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {key: rows[i] for key, rows in self.keyed_prompt.items()}


class _PairDataset(Dataset):
    """Chosen and rejected texts tokenised to ``max_length``; subclasses say which fields make each text."""

    prefix_field: Optional[str] = None

    def __init__(self, dataset: Any, tokenizer: Any, max_length: int, special_token: Optional[str] = None) -> None:
        super().__init__()
        self.end_token = eos_text(tokenizer) if special_token is None else special_token
        records = list(dataset)
        fields: Sequence[str] = ("chosen", "rejected") + ((self.prefix_field,) if self.prefix_field else ())
        for i, record in enumerate(records):
            if any(k not in record for k in fields):
                raise ValueError(f"{type(self).__name__}: record {i} needs the fields {list(fields)}")
        max_length = check_max_length(max_length)
        self.chosen = self._tokenise(records, "chosen", tokenizer, max_length)
        self.reject = self._tokenise(records, "rejected", tokenizer, max_length)

    def _tokenise(self, records: List[Any], field: str, tokenizer: Any, max_length: int) -> Dict[str, torch.Tensor]:
        prefix = (lambda r: r[self.prefix_field]) if self.prefix_field else (lambda r: "")
        tokens = _tokens(tokenizer, [prefix(r) + r[field] + self.end_token for r in records], max_length)
        return {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}

    def __len__(self) -> int:
        return self.chosen["input_ids"].shape[0]

    def __getitem__(self, idx: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.chosen["input_ids"][idx], self.chosen["attention_mask"][idx],
                self.reject["input_ids"][idx], self.reject["attention_mask"][idx])


@deprecated_api("coati.dataset.RmStaticDataset")
class RmStaticDataset(_PairDataset):
    """Reward-model pairs from ``prompt`` + ``chosen`` / ``rejected`` records (Dahoas/rm-static)."""

    prefix_field = "prompt"


@deprecated_api("coati.dataset.HhRlhfDataset")
class HhRlhfDataset(_PairDataset):
    """Reward-model pairs from ``chosen`` / ``rejected`` records (Anthropic/hh-rlhf, the prompt inside each)."""
