"""Checks and tensor assembly shared by the inference backends."""
from __future__ import annotations

import os
import random
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.rollout import Rollout, response_mask


def check_sampling(sampling: SamplingConfig) -> SamplingConfig:
    """Raises on a sampling config no backend can honour; returns it."""
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a coati_relay.config.schema.SamplingConfig, got {type(sampling).__name__}")
    if not isinstance(sampling.max_new_tokens, int) or sampling.max_new_tokens < 1:
        raise ValueError(f"SamplingConfig.max_new_tokens must be an int >= 1, got {sampling.max_new_tokens!r}")
    if sampling.temperature < 0:
        raise ValueError(f"SamplingConfig.temperature must be >= 0 (0: greedy), got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise ValueError(f"SamplingConfig.top_p must be in (0, 1] (1: off), got {sampling.top_p}")
    if not isinstance(sampling.top_k, int):
        raise TypeError(f"SamplingConfig.top_k must be an int (<= 0: off), got {sampling.top_k!r}")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in sampling.stop_token_ids):
        raise ValueError(f"SamplingConfig.stop_token_ids must be token ids (ints >= 0), got {sampling.stop_token_ids}")
    if any(not isinstance(t, str) or not t for t in sampling.stop_strings):
        raise ValueError(f"SamplingConfig.stop_strings must be non-empty strings, got {sampling.stop_strings!r}")
    return sampling


def check_prompts(prompts: Sequence[Sequence[int]], n: int, vocab_size: int,
                  max_prompt_len: Optional[int] = None) -> List[List[int]]:
    """Returns the prompts as lists of ints, raising on an empty batch, empty prompts or ids out of range."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"generate: n (responses per prompt) must be an int >= 1, got {n!r}")
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, Sequence) or isinstance(prompts, str):
        raise TypeError("generate: prompts must be a list of token-id lists without padding, "
                        f"got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("generate: prompts is empty; pass at least one prompt")
    if max_prompt_len is not None and max_prompt_len < 1:
        raise ValueError("generate: SamplingConfig.max_new_tokens fills the whole context of the model; lower it")
    out = []
    for i, p in enumerate(prompts):
        ids = p.tolist() if hasattr(p, "tolist") else list(p)  # tensors and numpy arrays give Python ints
        if not ids:
            raise ValueError(f"generate: prompt {i} is empty; every prompt needs at least one token")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
            raise TypeError(f"generate: prompt {i} must hold ints (token ids), got {ids[:8]}...")
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise ValueError(f"generate: prompt {i} has token ids outside [0, {vocab_size}): {ids[:8]}...")
        if max_prompt_len is not None and len(ids) > max_prompt_len:
            raise ValueError(f"generate: prompt {i} has {len(ids)} tokens; with max_new_tokens the backend fits "
                             f"{max_prompt_len}; shorten it or start the backend with a larger max_model_len")
        out.append(ids)
    return out


def check_info(info: Optional[Dict[str, list]], num_prompts: int) -> Dict[str, list]:
    """Per-prompt metadata: every value a list of ``num_prompts`` entries."""
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise TypeError(f"generate: info must be a dict of per-prompt lists, got {type(info).__name__}")
    for key, value in info.items():
        if not isinstance(value, (list, tuple)) or len(value) != num_prompts:
            raise ValueError(f"generate: info[{key!r}] must be a list with one entry per prompt ({num_prompts}), "
                             f"got {type(value).__name__} of length {len(value) if hasattr(value, '__len__') else '?'}")
    return {k: list(v) for k, v in info.items()}


def stop_token_ids(sampling: SamplingConfig, eos_token_ids: Iterable[int]) -> List[int]:
    """Token ids that end a response: the EOS ids (unless ``ignore_eos``) and ``sampling.stop_token_ids``."""
    ids: Set[int] = set(sampling.stop_token_ids)
    if not sampling.ignore_eos:
        ids.update(eos_token_ids)
    return sorted(ids)


class SeedSequence:
    """Seeds for generate calls: ``sampling.seed`` every call when set, else a reproducible stream from ``seed``."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def next(self, sampling: SamplingConfig) -> int:
        return sampling.seed if sampling.seed is not None else self._rng.randrange(2 ** 30)


def pad_prompts(prompts: List[List[int]], pad_token_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Left-pads B prompts: (ids LongTensor [B, P] with ``pad_token_id``, mask LongTensor [B, P], 1 on real tokens).

    The mask comes from the lengths, not from the ids, since a prompt may contain the pad id.
    """
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in prompts], dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompts])
    mask = (torch.arange(width).expand(len(prompts), width) >= (width - lengths).unsqueeze(1)).long()
    return ids, mask


def build_rollout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, response_ids: torch.Tensor,
                  logprobs: torch.Tensor, lengths: torch.Tensor, stop_ids: List[int], pad_token_id: int,
                  weight_version: int, info: Dict[str, list]) -> Rollout:
    """Assembles a prompt-major `Rollout`.

    prompt_ids, prompt_mask: [B, P] from `pad_prompts`; response_ids: LongTensor [B*n, R'] (row i*n+j: sample j of
    prompt i); logprobs: FloatTensor [B*n, R']; lengths: LongTensor [B*n], tokens generated per row.
    The response width is cut to the longest masked response; padding holds ``pad_token_id`` and log-prob 0.
    """
    mask = response_mask(response_ids, stop_ids, lengths)
    width = max(int(mask.sum(dim=1).max()), 1)
    mask = mask[:, :width]
    return Rollout(
        prompt_ids=prompt_ids.repeat_interleave(n, dim=0),
        prompt_mask=prompt_mask.repeat_interleave(n, dim=0),
        response_ids=response_ids[:, :width].masked_fill(~mask, pad_token_id),
        response_mask=mask,
        logprobs=logprobs[:, :width].float().masked_fill(~mask, 0.0),
        response_lengths=mask.sum(dim=1),
        group_size=n,
        weight_version=weight_version,
        info=info,
    )


def check_weight_update(tensors: Dict[str, torch.Tensor], expected: Dict[str, torch.Size], version: int,
                        where: str) -> None:
    """Raises unless ``tensors`` maps known HF parameter names to tensors of the expected shapes."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"{where}.load_weights: version must be an int >= 0, got {version!r}")
    if not isinstance(tensors, dict) or not tensors:
        raise ValueError(f"{where}.load_weights: tensors must be a non-empty dict of HF parameter name -> tensor")
    unknown = sorted(k for k in tensors if k not in expected)
    if unknown:
        example = next(iter(expected))
        raise ValueError(f"{where}.load_weights: {len(unknown)} unknown weight name(s), e.g. {unknown[:5]}; names "
                         f"must be the model's HF parameter names such as {example!r} (strip wrapper prefixes "
                         "like 'module.')")
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}.load_weights: {name!r} is a {type(t).__name__}, expected a torch.Tensor")
        if t.shape != expected[name]:
            raise ValueError(f"{where}.load_weights: {name!r} has shape {tuple(t.shape)}, the model expects "
                             f"{tuple(expected[name])}")
        if not t.is_floating_point():
            raise TypeError(f"{where}.load_weights: {name!r} has dtype {t.dtype}; weights must be floating point")


def checkpoint_eos_ids(model_path: str, tokenizer: Any, model_config: Any) -> List[int]:
    """EOS ids named by the tokenizer, the model config and the checkpoint's generation config (where present).

    vLLM stops at the generation config's EOS ids too, so both backends stop at the union.
    """
    from transformers import GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(str(model_path))
    except OSError:
        generation_config = None
    ids: Set[int] = set()
    for source in (tokenizer, model_config, generation_config):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)


def resolve_tokenizer(tokenizer: Any, model_path: str) -> Any:
    """The tokenizer to use: the object given, one loaded from the path given, or the one saved with the model."""
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(tokenizer or model_path))
    if not callable(getattr(tokenizer, "decode", None)):
        raise TypeError(f"tokenizer must be a transformers tokenizer or a path, got {type(tokenizer).__name__}")
    return tokenizer


def pad_id_of(tokenizer: Any, eos_ids: List[int]) -> int:
    """The tokenizer's pad id, or its first EOS id when it has none."""
    if getattr(tokenizer, "pad_token_id", None) is not None:
        return int(tokenizer.pad_token_id)
    if eos_ids:
        return eos_ids[0]
    raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token before building "
                     "the backend (or, without a tokenizer, pass pad_token_id)")


def special_token_ids(model_path: Optional[str], tokenizer: Any, model_config: Any,
                      eos_token_ids: Optional[Sequence[int]] = None, pad_token_id: Optional[int] = None
                      ) -> Tuple[Any, List[int], int, Optional[int]]:
    """(tokenizer or None, EOS ids, pad id, the main EOS id or None) of a backend.

    Without ``eos_token_ids``: the tokenizer (`resolve_tokenizer`) and the checkpoint's EOS ids. With them (a backend
    started from a module, with no checkpoint tokenizer): exactly those ids stop a response, and no tokenizer is
    loaded. ``pad_token_id`` (padding only) defaults to the tokenizer's pad id, else the first EOS id.
    """
    if eos_token_ids is None:
        if model_path is None and tokenizer is None:
            raise ValueError("a backend without a checkpoint path needs eos_token_ids (an empty list: no EOS stops "
                             "a response) or a tokenizer")
        tokenizer = resolve_tokenizer(tokenizer, model_path)
        eos_ids = checkpoint_eos_ids(model_path, tokenizer, model_config) if model_path is not None else \
            sorted({int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set())
    else:
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in eos_token_ids):
            raise ValueError(f"eos_token_ids must be token ids (ints >= 0), got {list(eos_token_ids)!r}")
        eos_ids = sorted(set(eos_token_ids))
    if pad_token_id is not None:
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or pad_token_id < 0:
            raise ValueError(f"pad_token_id must be a token id (an int >= 0), got {pad_token_id!r}")
        pad = pad_token_id
    else:
        pad = pad_id_of(tokenizer, eos_ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    return tokenizer, eos_ids, pad, eos if eos is not None else (eos_ids[0] if eos_ids else None)
