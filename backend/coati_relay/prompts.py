"""Prompt data: loading prompt files into token ids, and a deterministic sampler that cuts them into tasks.

Sources that `load_prompts` reads:

- ``.jsonl`` in ColossalChat's format, one object a line:
  ``{"messages": {"role": "user", "content": "..."}, "gt_answer": "..."}``. As ColossalChat's
  ``RawConversationDataset`` does, each prompt is the tokenizer's chat template (``add_generation_prompt=True``)
  applied to ``[system message, the message]``; a ``system_prompt`` of None means ColossalChat's default
  (`coati_relay.rewards.system_prompts.DEFAULT_SYSTEM_PROMPT`). Extension: ``messages`` may also be a list of
  messages; it then gets the system message unless it starts with its own.
- ``.csv`` with a ``prompt`` column, the legacy examples' format (extension): raw text, no chat template unless asked
  for, no system prompt unless given. Every other column (e.g. ``gt_answer``) is kept as per-prompt info.
- A list of strings (raw text) or a list of dicts shaped like the jsonl lines (extension: the chat template, and a
  system message only where ``system_prompt`` is given).

Prompts longer than ``max_prompt_tokens`` keep their *first* ``max_prompt_tokens`` tokens, as ColossalChat does (an
over-long prompt loses its end, the generation prompt included; a warning counts them). The prompts are held
unpadded; the inference backends pad them on the left (`coati_relay.inference.rollout_building.pad_prompts`).
"""
from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from coati_relay.rewards.system_prompts import DEFAULT_SYSTEM_PROMPT

logger = logging.getLogger(__name__)

PromptSource = Union[str, os.PathLike, Sequence[str], Sequence[Dict[str, Any]]]
_JSONL_EXAMPLE = '{"messages": {"role": "user", "content": "..."}, "gt_answer": "..."}'


@dataclass
class PromptDataset:
    """Tokenised prompts, unpadded.

    prompt_ids: one list of token ids per prompt (lengths differ; no padding).
    info:       per-prompt metadata, each value a list of ``len(prompt_ids)`` items: always ``prompt_text`` (the text
                that was tokenised, chat template applied), plus the source's other fields (e.g. ``gt_answer``),
                ``None`` where a prompt lacks one.
    """

    prompt_ids: List[List[int]]
    info: Dict[str, List[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, values in self.info.items():
            if len(values) != len(self.prompt_ids):
                raise ValueError(f"PromptDataset.info[{key!r}] has {len(values)} items, expected "
                                 f"{len(self.prompt_ids)} (one per prompt)")

    def __len__(self) -> int:
        return len(self.prompt_ids)


def _messages_of(record: Any, where: str) -> Tuple[List[Dict[str, str]], Dict[str, Any]]:
    """Splits one jsonl-style record into its chat messages and its other fields."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object like {_JSONL_EXAMPLE}, got {type(record).__name__}")
    if "messages" not in record:
        raise ValueError(f"{where}: no 'messages' field (fields: {sorted(record)}); each prompt needs one, "
                         f"like {_JSONL_EXAMPLE}")
    messages = record["messages"]
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a message object or a non-empty list of them, "
                         f"got {messages!r:.80}")
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: each message needs string 'role' and 'content' fields, got {m!r:.80}")
    return messages, {k: v for k, v in record.items() if k != "messages"}


def _read_jsonl(path: Path) -> Tuple[List[Any], List[str]]:
    """Returns the records of a jsonl file and where each came from (``path:line N``); blank lines are skipped."""
    records, wheres = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}, column {e.colno}); each line must be "
                                 f"one JSON object like {_JSONL_EXAMPLE}") from None
            wheres.append(f"{path}:{lineno}")
    return records, wheres


def _read_csv(path: Path) -> Tuple[List[Dict[str, str]], List[str]]:
    """Returns the rows of a CSV file (dicts by column) and where each came from (``path:line N``)."""
    rows, wheres = [], []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            return rows, wheres
        if "prompt" not in reader.fieldnames:
            raise ValueError(f"{path}: no 'prompt' column (columns: {reader.fieldnames}); a prompt CSV needs a header "
                             "row with a 'prompt' column and optionally 'gt_answer'")
        for row in reader:
            if None in row:
                raise ValueError(f"{path}:{reader.line_num}: more fields than the header's {len(reader.fieldnames)} "
                                 "columns; quote fields that contain commas")
            rows.append(row)
            wheres.append(f"{path}:{reader.line_num}")
    return rows, wheres


def _with_system(messages: List[Dict[str, str]], system_prompt: Optional[str], one_message: bool
                 ) -> List[Dict[str, str]]:
    """ColossalChat's ``[system, message]`` for one message; a list keeps a system message of its own."""
    if system_prompt is None or (not one_message and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}] + messages


def _chat_ids(tokenizer: Any, messages: List[Dict[str, str]]) -> Tuple[str, List[int]]:
    """The chat template's text and its token ids (tokenised by the template call itself, as ColossalChat does)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return text, list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def load_prompts(source: PromptSource, tokenizer: Any, max_prompt_tokens: int = 512,
                 system_prompt: Optional[str] = None, chat_template: Optional[bool] = None) -> PromptDataset:
    """Reads prompts and tokenises them.

    source:            a ``.jsonl`` or ``.csv`` path, a list of prompt strings, or a list of jsonl-style dicts.
    max_prompt_tokens: longer prompts keep their first ``max_prompt_tokens`` tokens (ColossalChat's truncation).
    system_prompt:     the ``system`` message before each conversation (a message list that starts with its own
                       keeps that one); needs the chat template. None: ColossalChat's default for a ``.jsonl`` path
                       (`DEFAULT_SYSTEM_PROMPT`), no system message for the other sources.
    chat_template:     None applies the tokenizer's chat template to message sources (jsonl, dicts) and not to raw
                       text (csv, strings); True applies it to raw text too, as one user message. Message sources
                       always need it.
    """
    if isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int) or max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be a positive int, got {max_prompt_tokens!r}")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {path} does not exist; pass the path of a .jsonl or .csv file")
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            records, wheres = _read_jsonl(path)
            is_chat = True
            system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        elif suffix == ".csv":
            records, wheres = _read_csv(path)
            is_chat = False
        else:
            raise ValueError(f"prompt file {path}: unknown extension {path.suffix!r}; use .jsonl (ColossalChat "
                             "messages format) or .csv (a 'prompt' column)")
        if not records:
            raise ValueError(f"prompt file {path} holds no prompts; add at least one line "
                             f"({_JSONL_EXAMPLE} for .jsonl, a header and rows for .csv)")
        label = str(path)
    elif isinstance(source, Sequence) and source:
        if all(isinstance(s, str) for s in source):
            records, is_chat = [{"prompt": s} for s in source], False
        elif all(isinstance(s, dict) for s in source):
            records, is_chat = list(source), True
        else:
            raise TypeError("load_prompts: a list source must hold only strings (raw prompts) or only dicts "
                            f"(like {_JSONL_EXAMPLE}), got {sorted({type(s).__name__ for s in source})}")
        wheres = [f"prompts[{i}]" for i in range(len(source))]
        label = "prompt list"
    elif isinstance(source, Sequence):
        raise ValueError("load_prompts: the prompt list is empty; pass at least one prompt")
    else:
        raise TypeError(f"load_prompts: source must be a .jsonl/.csv path or a list of prompts, "
                        f"got {type(source).__name__}")

    use_template = is_chat if chat_template is None else bool(chat_template)
    if is_chat and not use_template:
        raise ValueError(f"{label}: prompts given as chat messages need the chat template; "
                         "pass chat_template=True (or None)")
    if system_prompt is not None and not use_template:
        raise ValueError(f"{label}: system_prompt needs the chat template; pass chat_template=True")
    if use_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{label}: tokenizer {type(tokenizer).__name__} has no chat template; set "
                         "tokenizer.chat_template (a Jinja string), or for raw-text prompts pass chat_template=False")

    if system_prompt is not None and not isinstance(system_prompt, str):
        raise TypeError(f"{label}: system_prompt must be a string or None, got {type(system_prompt).__name__}")
    texts: List[str] = []
    ids: List[List[int]] = []
    info: Dict[str, List[Any]] = {}
    for i, (record, where) in enumerate(zip(records, wheres)):
        if is_chat:
            messages, extras = _messages_of(record, where)
            one_message = isinstance(record["messages"], dict)
        else:
            extras = {k: v for k, v in record.items() if k != "prompt"}
            messages, one_message = [{"role": "user", "content": record["prompt"] or ""}], True
        if use_template:  # chat templates write their own special tokens
            text, token_ids = _chat_ids(tokenizer, _with_system(messages, system_prompt, one_message))
            texts.append(text)
            ids.append(token_ids)
        else:
            texts.append(messages[0]["content"])
        for key, value in extras.items():
            info.setdefault(key, [None] * i).append(value)
        for values in info.values():
            values.extend([None] * (i + 1 - len(values)))
    if not use_template:  # raw text gets the tokenizer's usual special tokens
        ids = tokenizer(texts, add_special_tokens=True)["input_ids"]
    empty = [wheres[i] for i, t in enumerate(ids) if len(t) == 0]
    if empty:
        raise ValueError(f"{empty[0]}: the prompt tokenises to 0 tokens ({len(empty)} such prompts); remove empty "
                         "prompts or give them text")
    truncated = sum(len(t) > max_prompt_tokens for t in ids)
    if truncated:
        logger.warning("%s: %d of %d prompts exceed max_length=%d; kept their first %d tokens, as ColossalChat "
                       "does (the end of the prompt, its generation prompt included, is lost): raise max_length",
                       label, truncated, len(ids), max_prompt_tokens, max_prompt_tokens)
    prompt_ids = [list(t[:max_prompt_tokens]) for t in ids]
    return PromptDataset(prompt_ids=prompt_ids, info={**info, "prompt_text": texts})


class PromptSampler:
    """Cuts ``num_prompts`` prompts into tasks of ``batch_size`` prompt indices.

    ``batch(t)`` is a pure function of ``(seed, t)``: task ``t`` belongs to epoch ``t // tasks_per_epoch``, whose
    order is a permutation seeded by ``(seed, epoch)``, so any producer can run any task (the queue's task board
    hands the task numbers out).
    """

    def __init__(self, num_prompts: int, batch_size: int, seed: int = 42, shuffle: bool = True,
                 drop_last: bool = True):
        for name, value in (("num_prompts", num_prompts), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PromptSampler: {name} must be a positive int, got {value!r}")
        if batch_size > num_prompts:
            raise ValueError(f"PromptSampler: batch_size={batch_size} is larger than the {num_prompts} prompts; "
                             "lower the batch size or add prompts")
        self.num_prompts, self.batch_size = num_prompts, batch_size
        self.seed, self.shuffle, self.drop_last = int(seed), bool(shuffle), bool(drop_last)
        self._cached: Tuple[int, Optional[np.ndarray]] = (-1, None)

    @property
    def tasks_per_epoch(self) -> int:
        full, rest = divmod(self.num_prompts, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _order(self, epoch: int) -> np.ndarray:
        if self._cached[0] != epoch:
            order = (np.random.default_rng([self.seed, epoch]).permutation(self.num_prompts) if self.shuffle
                     else np.arange(self.num_prompts))
            self._cached = (epoch, order)
        return self._cached[1]

    def batch(self, task_index: int) -> List[int]:
        """Prompt indices of global task ``task_index`` (``batch_size`` of them; fewer only for the last task of an
        epoch when ``drop_last`` is False)."""
        if isinstance(task_index, bool) or not isinstance(task_index, (int, np.integer)) or task_index < 0:
            raise ValueError(f"PromptSampler.batch: task_index must be an int >= 0, got {task_index!r}")
        epoch, k = divmod(int(task_index), self.tasks_per_epoch)
        return self._order(epoch)[k * self.batch_size:(k + 1) * self.batch_size].tolist()
