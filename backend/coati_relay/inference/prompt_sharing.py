"""One forward per distinct prompt: the G samples of a group repeat their prompt, so its key/value cache is computed
once and indexed out to the group's rows.

With a prompt of P tokens and a response of R, a group costs ``P + G * R`` token-forwards instead of
``G * (P + R)``, in generation (the prefill) and in training (forward and backward: the prompt's share of the
gradient comes back through the indexed cache). Only transformers causal LMs (``past_key_values``, ``position_ids``,
``use_cache``) take this path; the values equal those of the full forward up to float rounding.
"""
from __future__ import annotations

from typing import Any, Optional

import torch


def prompt_runs(prompts: torch.Tensor, prompt_mask: torch.Tensor) -> Optional[torch.Tensor]:
    """The run each row belongs to, counting runs of adjacent rows with equal prompts: LongTensor [N] of values
    0 .. U-1 (non-decreasing), or None when no two adjacent rows share a prompt (nothing to share).

    prompts, prompt_mask: [N, P], left-padded prompt ids and their mask.
    """
    if prompts.size(0) < 2:
        return None
    same = ((prompts[1:] == prompts[:-1]) & (prompt_mask[1:] == prompt_mask[:-1])).all(dim=1)
    if not bool(same.any()):
        return None
    starts = torch.cat([torch.ones(1, dtype=torch.long, device=prompts.device), (~same).long()])
    return starts.cumsum(0) - 1


def real_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids [N, S] counting real tokens only (``cumsum(mask) - 1``, 0 on the left padding), as a generator
    numbers a left-padded prompt."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def prefill_shared(model: torch.nn.Module, prompts: torch.Tensor, prompt_mask: torch.Tensor,
                   rows: torch.Tensor) -> Any:
    """The cache of every prompt column but the last, computed once per distinct prompt and indexed out to rows.

    prompts, prompt_mask: [U, P] distinct prompts (left-padded, P >= 2); rows: LongTensor [N], the prompt of each
    row. Returns the model's cache holding N rows of P - 1 positions; the caller feeds the last prompt column (and
    any tokens after it) with the [N, P + ...] attention mask. Gradients flow to the model when called outside
    ``torch.no_grad``.
    """
    out = model(input_ids=prompts[:, :-1], attention_mask=prompt_mask[:, :-1].long(),
                position_ids=real_positions(prompt_mask)[:, :-1], use_cache=True, logits_to_keep=1)
    cache = getattr(out, "past_key_values", None)
    if cache is None:
        raise RuntimeError(f"prefill_shared: {type(model).__name__} returned no past_key_values with use_cache=True "
                           "(gradient checkpointing turns the cache off); share prompts only with a model that "
                           "returns its cache")
    cache.batch_select_indices(rows)
    return cache


def shared_prompt_logits(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor,
                         num_response_tokens: int, always: bool = False) -> Optional[torch.Tensor]:
    """The logits [N, R + 1, V] at the last prompt position and each response position, with one forward per run
    of equal adjacent prompts; None when no two adjacent rows share a prompt or the prompt has one column.

    sequences, attention_mask: [N, S], left-padded prompts then right-padded responses (``Rollout.sequences``).
    Position ids count real tokens, as in `coati_relay.roles.logprobs.response_logprobs`.
    always: two forwards (the prompts', then the rest) even where no two rows share a prompt (each row is then its
    own run), so that the number of forwards does not depend on the data: data-parallel ranks under DDP broadcast
    buffers in each forward, and must run as many. The prompt must have two columns or more.
    """
    width = sequences.size(1) - num_response_tokens
    prompts, prompt_mask = sequences[:, :width], attention_mask[:, :width]
    if always and width < 2:
        raise ValueError(f"shared_prompt_logits(always=True) needs prompts of 2 columns or more, got {width}")
    runs = prompt_runs(prompts, prompt_mask) if width >= 2 else None
    if runs is None and always:
        runs = torch.arange(sequences.size(0), device=sequences.device)
    if runs is None:
        return None
    firsts = torch.cat([torch.zeros(1, dtype=torch.long, device=runs.device),
                        (runs[1:] != runs[:-1]).nonzero()[:, 0] + 1])
    cache = prefill_shared(model, prompts[firsts], prompt_mask[firsts], runs)
    mask = attention_mask.long()
    tail = slice(width - 1, None)  # the last prompt column and the response
    out = model(input_ids=sequences[:, tail], attention_mask=mask, position_ids=real_positions(mask)[:, tail],
                past_key_values=cache, use_cache=False)
    return out.logits
