"""Legacy ``coati.models.generation``: the maker's multinomial sampling loop.

Semantics kept from the legacy loop: left-padded prompts, sampling only (``do_sample=True``, one beam),
``max_length`` counts prompt plus response, rows that have produced EOS are continued with ``pad_token_id``, and
the loop stops before ``max_length`` only with ``early_stopping=True`` once every row (across the data-parallel
group, when one exists) has finished. Logits go through temperature, top-k and top-p, in that order.

The legacy ``prepare_inputs_fn`` / ``update_model_kwargs_fn`` hooks (bound to transformers internals that changed
in transformers 5) are accepted and not called: the loop keeps its own KV cache, attention mask and positions.
Other unknown keywords are ignored with one warning, as the legacy hooks ignored them.

Both releases' call forms are accepted: ``generate(model, input_ids, max_length, ..., eos_token_id=,
pad_token_id=)`` (reference) and ``generate(model, input_ids, tokenizer, max_length, ...)`` (final release, where
the tokenizer gives the EOS and pad ids and the model may be the ``Actor`` wrapper).
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from torch import nn

from coati_compat.imports.deprecations import deprecated_api
from coati_relay.parts import response_mask

logger = logging.getLogger(__name__)

_HOOKS = ("prepare_inputs_fn", "update_model_kwargs_fn", "use_cache")


def _logits_processors(top_k: Optional[int], top_p: Optional[float], temperature: Optional[float]):
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    processors = LogitsProcessorList()
    if temperature is not None and temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_k is not None and top_k != 0:
        processors.append(TopKLogitsWarper(top_k))
    if top_p is not None and top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    return processors


def _takes_position_ids(model: nn.Module) -> bool:
    """False for models that derive positions from the attention mask (BLOOM)."""
    return "position_ids" in inspect.signature(model.forward).parameters


def _all_finished(unfinished: torch.Tensor) -> bool:
    """True when no row of any data-parallel rank is still generating. unfinished: LongTensor [B] of 0/1."""
    remaining = unfinished.sum()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(remaining)
    return remaining.item() == 0


def default_generate_kwargs(generate_kwargs: Dict[str, Any], model: nn.Module) -> Dict[str, Any]:
    """A copy of ``generate_kwargs`` with the legacy defaults added where absent: ``prepare_inputs_fn`` and
    ``update_model_kwargs_fn``, the Hugging Face ``model``'s input-preparation hooks (accepted, not called)."""
    out = dict(generate_kwargs)
    for key, attr in (("prepare_inputs_fn", "prepare_inputs_for_generation"),
                      ("update_model_kwargs_fn", "_update_model_kwargs_for_generation")):
        if key not in out and hasattr(model, attr):
            out[key] = getattr(model, attr)
    return out


def check_generate_args(max_length: Any, num_beams: int, do_sample: bool, eos_token_id: Optional[int],
                        pad_token_id: Optional[int], model_kwargs: dict) -> Optional[torch.Tensor]:
    """Refuses what the legacy loop cannot do; pops the attention mask [B,P] (returned) and the legacy hooks out of
    ``model_kwargs`` and warns about what is left (ignored, as the legacy hooks ignored it)."""
    if num_beams != 1 or not do_sample:
        raise NotImplementedError("the legacy generate samples only (do_sample=True, num_beams=1); got "
                                  f"do_sample={do_sample}, num_beams={num_beams}")
    if eos_token_id is not None and pad_token_id is None:
        raise ValueError("generate needs pad_token_id when eos_token_id is set (finished rows are padded)")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive int (prompt plus response tokens), got {max_length!r}")
    attention_mask = model_kwargs.pop("attention_mask", None)
    for hook in _HOOKS:
        model_kwargs.pop(hook, None)
    if model_kwargs:
        logger.warning("legacy generate ignores the keywords %s", sorted(model_kwargs))
    return attention_mask


def _reference_form(max_length: int, num_beams: int = 1, do_sample: bool = True, early_stopping: bool = False,
                    eos_token_id: Optional[int] = None, pad_token_id: Optional[int] = None, top_k: Optional[int] = None,
                    top_p: Optional[float] = None, temperature: Optional[float] = None,
                    prepare_inputs_fn: Any = None, update_model_kwargs_fn: Any = None,
                    **model_kwargs: Any) -> Dict[str, Any]:
    """Binds the arguments after ``input_ids`` in the reference order (``b5f056636``); the hooks are dropped."""
    return dict(max_length=max_length, num_beams=num_beams, do_sample=do_sample, early_stopping=early_stopping,
                eos_token_id=eos_token_id, pad_token_id=pad_token_id, top_k=top_k, top_p=top_p,
                temperature=temperature, **model_kwargs)


def _final_release_form(tokenizer: Any, max_length: int, num_beams: int = 1, do_sample: bool = True,
                        early_stopping: bool = False, top_k: Optional[int] = None, top_p: Optional[float] = None,
                        temperature: Optional[float] = None, prepare_inputs_fn: Any = None,
                        update_model_kwargs_fn: Any = None, **model_kwargs: Any) -> Dict[str, Any]:
    """Binds the arguments after ``input_ids`` in the final release's order (``be400a093``): the tokenizer (checked
    by ``_check_tokenizer``) supplies ``eos_token_id`` and ``pad_token_id``."""
    for key in ("eos_token_id", "pad_token_id"):
        if key in model_kwargs:
            raise TypeError(f"generate(model, input_ids, tokenizer, ...) takes {key} from the tokenizer; drop "
                            f"{key}= or call generate(model, input_ids, max_length, eos_token_id=, pad_token_id=)")
    return dict(max_length=max_length, num_beams=num_beams, do_sample=do_sample, early_stopping=early_stopping,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, top_k=top_k, top_p=top_p,
                temperature=temperature, **model_kwargs)


def _check_tokenizer(tokenizer: Any) -> None:
    missing = [a for a in ("padding_side", "eos_token_id", "pad_token_id") if not hasattr(tokenizer, a)]
    if missing:
        raise TypeError(f"generate's third argument is a tokenizer (final-release form) or max_length (int); got "
                        f"{type(tokenizer).__name__} without {', '.join(missing)}")
    if tokenizer.padding_side != "left":
        raise ValueError(f"generate needs a tokenizer with padding_side='left' (the prompts are left-padded); got "
                         f"{tokenizer.padding_side!r}: set tokenizer.padding_side = 'left'")


@deprecated_api("coati.models.generation.generate")
@torch.no_grad()
def generate(model: nn.Module, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Samples continuations of ``input_ids`` [B,P] (left-padded) up to ``max_length`` tokens in total.

    Both legacy call forms, told apart by the third argument:
    ``generate(model, input_ids, max_length, num_beams=1, do_sample=True, early_stopping=False, eos_token_id=None,
    pad_token_id=None, top_k=None, top_p=None, temperature=None, ...)`` (reference) and
    ``generate(model, input_ids, tokenizer, max_length, num_beams=1, do_sample=True, early_stopping=False,
    top_k=None, top_p=None, temperature=None, ...)`` (final release: the tokenizer gives the EOS and pad ids).
    ``model`` is a Hugging Face causal LM or a legacy ``Actor`` (its ``model`` samples). ``attention_mask`` [B,P] may
    be passed among the keywords (default: attend to every prompt token). Returns sequences [B,S] with
    P <= S <= max_length.
    """
    final = "tokenizer" in kwargs or bool(args) and not isinstance(args[0], int)
    if final:
        _check_tokenizer(kwargs["tokenizer"] if "tokenizer" in kwargs else args[0])
    form = _final_release_form if final else _reference_form
    try:
        options = form(*args, **kwargs)
    except TypeError as exc:
        if "generate" in str(exc):
            raise
        detail = str(exc).split("() ", 1)[-1]  # drop the private binder's name
        raise TypeError(f"generate(model, input_ids, max_length, ...) or generate(model, input_ids, tokenizer, "
                        f"max_length, ...): {detail}") from None
    from coati_compat.legacy.model_base import Actor

    if isinstance(model, Actor):
        model = model.model
    return _sample(model, input_ids, **options)


def _sample(model: nn.Module, input_ids: torch.Tensor, max_length: int, num_beams: int = 1, do_sample: bool = True,
            early_stopping: bool = False, eos_token_id: Optional[int] = None, pad_token_id: Optional[int] = None,
            top_k: Optional[int] = None, top_p: Optional[float] = None, temperature: Optional[float] = None,
            **model_kwargs: Any) -> torch.Tensor:
    """The sampling loop of :func:`generate` (arguments in the reference form)."""
    attention_mask = check_generate_args(max_length, num_beams, do_sample, eos_token_id, pad_token_id, model_kwargs)
    if input_ids.size(1) >= max_length:
        return input_ids
    processors = _logits_processors(top_k, top_p, temperature)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device=input_ids.device, dtype=torch.long)
        positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    else:
        positions = torch.arange(input_ids.size(1), device=input_ids.device).expand_as(input_ids)
    takes_positions = _takes_position_ids(model)
    unfinished = input_ids.new_ones(input_ids.size(0))
    step_ids, past = input_ids, None
    for _ in range(input_ids.size(1), max_length):
        extra = {"position_ids": positions} if takes_positions else {}
        out = model(input_ids=step_ids, attention_mask=attention_mask, past_key_values=past, use_cache=True, **extra)
        past = out["past_key_values"]
        logits = processors(input_ids, out["logits"][:, -1, :])
        next_tokens = torch.multinomial(torch.softmax(logits, dim=-1, dtype=torch.float), num_samples=1).squeeze(1)
        if eos_token_id is not None:
            next_tokens = next_tokens * unfinished + pad_token_id * (1 - unfinished)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        step_ids = next_tokens[:, None]
        positions = positions[:, -1:] + 1
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.size(0), 1)], dim=1)
        if eos_token_id is not None:
            unfinished = unfinished * (next_tokens != eos_token_id).long()
        if early_stopping and _all_finished(unfinished):
            break
    return input_ids


def action_mask_after_prompt(sequences: torch.Tensor, input_len: int, eos_token_id: Optional[int]) -> torch.Tensor:
    """BoolTensor [B, S - input_len]: True on generated tokens up to and including the first EOS (all True
    without an EOS id). sequences: [B,S]."""
    return response_mask(sequences[:, input_len:], [] if eos_token_id is None else [eos_token_id])
