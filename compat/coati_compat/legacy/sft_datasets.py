"""Legacy ``coati.dataset.sft_dataset``: ``SFTDataset`` and ``SupervisedDataset`` (final release, ColossalAI
``be400a093``), supervised fine-tuning samples as plain tokenisation.

Each sample is ``prompt + completion + eos`` tokenised to exactly ``max_length`` tokens (padded, truncated on the
tokenizer's sides), with ``labels`` equal to the token ids except ``IGNORE_INDEX`` on the prompt tokens and on the
padding. ``SFTDataset`` reads ``prompt`` / ``completion`` records; ``SupervisedDataset`` a JSON list of Alpaca-style
``instruction`` / ``input`` / ``output`` records, formatted with ``PROMPT_DICT``.

A ChatGLM tokenizer (one with ``gmask_token_id``) is tokenised as ChatGLM-6B expects:
``prompt [gMASK] <bos> completion <eos>``, right-padded, labels from ``<bos>`` on, no attention mask (the model
derives it from the ids). Prompts too long for ``max_length`` lose their first tokens; the ``[gMASK] <bos>`` pair
is always kept.
"""
from __future__ import annotations

import io
import json
import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset

from coati_compat.imports.deprecations import deprecated_api

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
PROMPT_DICT = {
    "prompt_input": (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
    ),
    "prompt_no_input": (
        "Below is an instruction that describes a task. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Response:"
    ),
}

__all__ = ["IGNORE_INDEX", "PROMPT_DICT", "SFTDataset", "SupervisedDataset"]


def jload(f: Any, mode: str = "r") -> Any:
    """The JSON content of a path or of an open file."""
    if isinstance(f, io.IOBase):
        return json.load(f)
    try:
        with open(f, mode) as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"{f}: not a JSON file ({error})") from error

Tokenised = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


def eos_text(tokenizer: Any) -> str:
    """The tokenizer's EOS token text; a clear error when it has none."""
    eos = getattr(tokenizer, "eos_token", None)
    if not isinstance(eos, str):
        raise ValueError(f"the legacy datasets end every sample with the tokenizer's eos_token; "
                         f"{type(tokenizer).__name__} has none (set tokenizer.eos_token)")
    return eos


def check_max_length(max_length: Any) -> int:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive int, got {max_length!r}")
    return max_length


def _is_chatglm(tokenizer: Any) -> bool:
    return hasattr(tokenizer, "gmask_token_id") and hasattr(tokenizer, "build_inputs_with_special_tokens")


def tokenize_supervised(sources: Sequence[str], targets: Sequence[str], tokenizer: Any, max_length: int) -> Tokenised:
    """``(input_ids, labels, attention_mask)``, each [N, max_length], of ``source + target`` per sample; labels are
    ``IGNORE_INDEX`` on the source tokens and on the padding."""
    if tokenizer.padding_side not in ("left", "right"):
        raise ValueError(f"tokenizer.padding_side must be 'left' or 'right', got {tokenizer.padding_side!r}")
    kwargs = dict(max_length=max_length, padding="max_length", truncation=True, return_tensors="pt")
    sequences = tokenizer([s + t for s, t in zip(sources, targets)], **kwargs)
    source_lengths = tokenizer(list(sources), **kwargs)["attention_mask"].sum(dim=1)
    input_ids, attention_mask = sequences["input_ids"], sequences["attention_mask"]
    if input_ids.dim() != 2:
        raise ValueError(f"expected token ids [N, max_length], got {tuple(input_ids.shape)} (a seq2seq tokenizer?)")
    labels = input_ids.clone()
    positions = torch.arange(max_length).expand_as(labels)
    lengths = attention_mask.sum(dim=1, keepdim=True)
    if tokenizer.padding_side == "right":  # |prompt|completion|eos|pad|
        ignored = (positions < source_lengths[:, None]) | (positions >= lengths)
    else:  # |pad|prompt|completion|eos|
        ignored = positions < (max_length - lengths) + source_lengths[:, None]
    labels[ignored] = IGNORE_INDEX
    return input_ids, labels, attention_mask


def _chatglm_ids(source: str, target: str, tokenizer: Any, max_length: int) -> Tuple[List[int], List[int]]:
    source_ids = tokenizer.encode(text=source, add_special_tokens=False)
    target_ids = tokenizer.encode(text=target, add_special_tokens=False)
    ids = list(tokenizer.build_inputs_with_special_tokens(source_ids, target_ids))
    markers = [tokenizer.gmask_token_id, tokenizer.bos_token_id]
    excess = len(ids) - max_length
    if excess > 0:
        start = ids.index(tokenizer.bos_token_id) - 1  # where [gMASK] <bos> begins
        if excess <= start:
            ids = ids[excess:]
        else:  # the whole prompt goes, and the response's first tokens with it
            ids = markers + ids[excess + 2:]
    context = ids.index(tokenizer.bos_token_id)
    labels = [IGNORE_INDEX] * context + ids[context:]
    pad = max_length - len(ids)
    return ids + [tokenizer.pad_token_id] * pad, labels + [IGNORE_INDEX] * pad


def tokenize_chatglm(sources: Sequence[str], targets: Sequence[str], tokenizer: Any, max_length: int) -> Tokenised:
    """``(input_ids, labels, None)`` [N, max_length] in ChatGLM's layout (see the module docstring)."""
    if max_length < 3:
        raise ValueError(f"ChatGLM samples need max_length >= 3 ([gMASK] <bos> and one token), got {max_length}")
    pairs = [_chatglm_ids(s, t, tokenizer, max_length) for s, t in zip(sources, targets)]
    return torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs]), None


def tokenize(sources: Sequence[str], targets: Sequence[str], tokenizer: Any, max_length: int) -> Tokenised:
    logger.info("tokenizing %d samples", len(sources))
    if _is_chatglm(tokenizer):
        return tokenize_chatglm(sources, targets, tokenizer, max_length)
    return tokenize_supervised(sources, targets, tokenizer, max_length)


def _records(dataset: Any, keys: Sequence[str], what: str) -> List[Dict[str, Any]]:
    records = list(dataset)
    for i, record in enumerate(records):
        missing = [k for k in keys if k not in record]
        if missing:
            raise ValueError(f"{what}: record {i} has no {missing} (each record needs {list(keys)})")
    return records


class _TokenisedSamples(Dataset):
    """Samples ``dict(input_ids, labels[, attention_mask])`` of tensors [max_length]."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    attention_mask: Optional[torch.Tensor]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, idx: int) -> Dict[str, torch.Tensor]:
        if self.attention_mask is None:
            return dict(input_ids=self.input_ids[idx], labels=self.labels[idx])
        return dict(input_ids=self.input_ids[idx], labels=self.labels[idx], attention_mask=self.attention_mask[idx])


@deprecated_api("coati.dataset.SFTDataset")
class SFTDataset(_TokenisedSamples):
    """dataset: records with ``prompt`` and ``completion`` (a list, or e.g. a ``datasets.Dataset``)."""

    def __init__(self, dataset: Any, tokenizer: Any, max_length: int = 512) -> None:
        super().__init__()
        records = _records(dataset, ("prompt", "completion"), "SFTDataset")
        eos = eos_text(tokenizer)
        self.input_ids, self.labels, self.attention_mask = tokenize(
            [r["prompt"] for r in records], [r["completion"] + eos for r in records], tokenizer,
            check_max_length(max_length))


@deprecated_api("coati.dataset.SupervisedDataset")
class SupervisedDataset(_TokenisedSamples):
    """data_path: a JSON list of ``instruction`` / ``output`` records (``input`` optional: a record that has the key
    is formatted with ``PROMPT_DICT["prompt_input"]``); the first ``max_datasets_size`` are kept (None: all)."""

    def __init__(self, data_path: str, tokenizer: Any, max_datasets_size: Optional[int] = None,
                 max_length: int = 512) -> None:
        super().__init__()
        records = jload(data_path)
        if max_datasets_size is not None:
            records = records[:max_datasets_size]
        records = _records(records, ("instruction", "output"), f"SupervisedDataset({data_path!r})")
        with_input, without_input = PROMPT_DICT["prompt_input"], PROMPT_DICT["prompt_no_input"]
        sources = [(with_input if "input" in r else without_input).format_map(r) for r in records]
        eos = eos_text(tokenizer)
        self.input_ids, self.labels, self.attention_mask = tokenize(
            sources, [r["output"] + eos for r in records], tokenizer, check_max_length(max_length))
