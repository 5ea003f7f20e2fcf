"""The transformers backend's decode loop: one forward per new token over a preallocated key/value cache, sampling on
preallocated buffers, finished rows dropped from the batch.

Per step: the one-token forward (the model's own, or `coati_relay.inference.fused_step`'s), the sampling processors
(temperature, then top-k, then top-p, as transformers' ``generate`` applies them), one draw, the drawn token's
log-prob, and a stop check. No logits outlive their step. The cache holds every row's keys and values in buffers
sized for the whole call (`PreallocatedLayer`), so a step writes one column instead of copying the cache.

Draws equal ``torch.multinomial(softmax(scores), 1)`` (its one-sample path: ``argmax(p / q)`` with ``q ~ Exp(1)``
drawn over the batch's [rows, V]), so while every row is in the batch the tokens are those of transformers' sampler
under the same seed. Rows that stopped keep being sampled (and ignored) until an eighth of the batch has stopped;
then the batch is compacted, and from there the random stream differs from ``generate``'s, which samples every row
to the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from transformers.cache_utils import Cache, DynamicLayer

from coati_relay.config.schema import SamplingConfig

COMPACT_FRACTION = 8  # the batch drops its stopped rows once 1/COMPACT_FRACTION of them stopped


class PreallocatedLayer(DynamicLayer):
    """One layer's cache in buffers [rows, heads, capacity, head_dim] allocated once; ``keys``/``values`` are views of
    the rows in the batch and the positions written so far, and a step writes its column in place.

    ``batch_select_indices`` (rows leaving the batch) moves the kept rows to the front of the same buffers.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.rows = 0

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> "PreallocatedLayer":
        """A layer whose first positions are ``keys``/``values`` [rows, heads, length, head_dim]."""
        layer = cls(capacity)
        layer.update(keys, values)
        return layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            rows, heads = key_states.shape[:2]
            self._keys = key_states.new_empty(rows, heads, self.capacity, key_states.size(-1))
            self._values = value_states.new_empty(rows, heads, self.capacity, value_states.size(-1))
            self.dtype, self.device, self.rows, self.is_initialized = key_states.dtype, key_states.device, rows, True
        end = self.length + key_states.size(-2)
        if end > self.capacity:
            raise RuntimeError(f"PreallocatedLayer: {end} positions exceed the capacity of {self.capacity}")
        self._keys[:self.rows, :, self.length:end] = key_states
        self._values[:self.rows, :, self.length:end] = value_states
        self.length = end
        self._view()
        return self.keys, self.values

    def _view(self) -> None:
        self.keys = self._keys[:self.rows, :, :self.length]
        self.values = self._values[:self.rows, :, :self.length]

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        kept = indices.numel()
        self._keys[:kept, :, :self.length] = self.keys[indices]
        self._values[:kept, :, :self.length] = self.values[indices]
        self.rows = kept
        self._view()


def preallocated_cache(prefilled: Optional[Cache], num_layers: int, capacity: int) -> Cache:
    """A cache of `PreallocatedLayer`s of ``capacity`` positions: holding what ``prefilled`` (a cache of the model's
    layers, e.g. `coati_relay.inference.prompt_sharing.prefill_shared`'s) holds, or empty (its buffers made by the first
    forward) when None."""
    if prefilled is None:
        return Cache(layers=[PreallocatedLayer(capacity) for _ in range(num_layers)])
    return Cache(layers=[PreallocatedLayer.holding(layer.keys, layer.values, capacity) for layer in prefilled.layers])


@dataclass
class Decoded:
    """What `decode` returns. tokens: LongTensor [N, R]; logprobs: FloatTensor [N, R], each drawn token's log-prob
    under the distribution it was drawn from; lengths: LongTensor [N], tokens generated per row (through its stop
    token); R: the steps run (the longest row). Entries past a row's length are not part of it (a stopped row may
    have been sampled on until the batch was compacted): mask them with ``lengths``."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor


class TokenSampler:
    """Draws one token per row from ``[rows, V]`` logits, as ``generate`` does with ``sampling``'s temperature, top-k
    and top-p (temperature 0: the argmax, with the untempered log-prob), on buffers sized for ``rows`` x ``V``."""

    def __init__(self, sampling: SamplingConfig, rows: int, vocab: int, device: torch.device):
        self.greedy = sampling.temperature == 0 or not sampling.do_sample
        self.temperature = sampling.temperature
        self.top_k = min(sampling.top_k, vocab) if sampling.top_k > 0 else 0
        self.top_p = sampling.top_p
        self._scores = torch.empty(rows, vocab, device=device)
        self._noise = torch.empty(rows, vocab, device=device)
        self._tokens = torch.empty(rows, 1, dtype=torch.long, device=device)

    def __call__(self, logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """logits: [A, V]. Returns (tokens LongTensor [A], log-probs FloatTensor [A])."""
        rows = logits.size(0)
        scores = self._scores[:rows]
        if self.greedy or self.temperature == 1.0:
            scores.copy_(logits)
        else:
            torch.div(logits, self.temperature, out=scores)
        tokens = self._tokens[:rows]
        if self.greedy:
            torch.argmax(scores, dim=-1, keepdim=True, out=tokens)
        else:
            if self.top_k:
                kth = torch.topk(scores, self.top_k, dim=-1).values[:, -1:]
                scores.masked_fill_(scores < kth, float("-inf"))
            if self.top_p < 1.0:
                ascending, order = torch.sort(scores, dim=-1)
                drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - self.top_p
                drop[:, -1] = False
                scores.masked_fill_(drop.scatter(1, order, drop), float("-inf"))
            noise = self._noise[:rows].exponential_()
            torch.div(torch.softmax(scores, dim=-1), noise, out=noise)
            torch.argmax(noise, dim=-1, keepdim=True, out=tokens)
        logprobs = scores.gather(1, tokens).sub_(torch.logsumexp(scores, dim=-1, keepdim=True))
        return tokens[:, 0], logprobs[:, 0]


class StopStrings:
    """Transformers' ``stop_strings``: a row stops at the token after which its response's text ends with one of
    ``strings``. Only the last tokens that can hold the longest string are decoded (each token is at least a byte)."""

    def __init__(self, tokenizer: Any, strings: Sequence[str]):
        if tokenizer is None:
            raise ValueError("stop strings need a tokenizer to read the text; give the backend one (tokenizer=...)")
        self.tokenizer, self.strings = tokenizer, tuple(strings)
        self.window = max(len(s.encode("utf-8")) for s in self.strings)

    def __call__(self, tokens: torch.Tensor, end: int) -> torch.Tensor:
        """tokens: LongTensor [A, >= end], the rows' responses so far; returns BoolTensor [A]: ends with a string."""
        tails = tokens[:, max(0, end - self.window):end].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return torch.tensor([t.endswith(self.strings) for t in texts], dtype=torch.bool, device=tokens.device)


def decode(step: Callable[..., torch.Tensor], cache: Cache, last_prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
           sampling: SamplingConfig, stop_ids: List[int], pad_token_id: int,
           stop_strings: Optional[StopStrings] = None) -> Decoded:
    """Samples up to ``sampling.max_new_tokens`` tokens per row under ``no_grad``, each step's logits from ``step``
    (`coati_relay.inference.fused_step`'s `ModelStep` or `FusedStep`).

    cache: the model's cache of every prompt column but the last ([N rows, P - 1 positions], capacity at least
    P - 1 + max_new_tokens; empty when P = 1); last_prompt_ids: LongTensor [N], each row's last prompt token;
    prompt_mask: [N, P], left-padded prompt mask. Rows stop after a token of ``stop_ids``, or (``stop_strings``)
    after the token that ends their text with a stop string.
    """
    rows, width = prompt_mask.shape
    steps, device = sampling.max_new_tokens, prompt_mask.device
    sampler: Optional[TokenSampler] = None
    mask = torch.ones(rows, width + steps, dtype=torch.long, device=device)
    mask[:, :width] = prompt_mask
    positions = prompt_mask.long().sum(dim=1) - 1  # of the token each row feeds next
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    tokens = torch.full((rows, steps), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(rows, steps, device=device)
    lengths = torch.full((rows,), steps, dtype=torch.long, device=device)
    row_of = torch.arange(rows, device=device)  # original row of each row in the batch
    alive = torch.ones(rows, dtype=torch.bool, device=device)
    feed = last_prompt_ids
    taken = 0
    for t in range(steps):
        logits = step(feed, mask[:row_of.numel(), :width + t], positions, cache)
        sampler = sampler or TokenSampler(sampling, rows, logits.size(-1), device)
        feed, drawn_logprobs = sampler(logits)
        tokens[row_of, t] = feed
        logprobs[row_of, t] = drawn_logprobs
        taken = t + 1
        if not stop_ids and stop_strings is None:
            positions += 1
            continue
        stopped = alive & torch.isin(feed, stops)
        if stop_strings is not None:
            stopped |= alive & stop_strings(tokens[row_of, :t + 1], t + 1)
        lengths[row_of[stopped]] = t + 1
        alive &= ~stopped
        left = int(alive.sum())
        if left == 0:
            break
        if (alive.numel() - left) * COMPACT_FRACTION >= alive.numel():
            keep = alive.nonzero()[:, 0]
            cache.batch_select_indices(keep)
            mask[:left] = mask[keep]
            row_of, positions, feed, alive = row_of[keep], positions[keep], feed[keep], alive[keep]
        positions += 1
    lengths.clamp_(max=taken)
    return Decoded(tokens[:, :taken], logprobs[:, :taken], lengths)
