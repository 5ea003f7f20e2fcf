"""Log-probs of sampled response tokens, recomputed by a model (the consumer's view of a rollout).

The log-softmax over the vocabulary is taken in blocks of about ``BLOCK_ELEMENTS`` logits, forward and backward, so
that no full-vocabulary float32 tensor of every response position is held besides the model's own logits.
"""
from __future__ import annotations

import inspect
from typing import Any, List, Optional, Tuple

import torch

from coati_relay.inference.prompt_sharing import real_positions, shared_prompt_logits

# Logits per block of the log-softmax (float32: 4 MiB); a block holds whole vocabulary rows. Measured with a
# 152k vocabulary, blocks of 2**18 to 2**21 logits keep the peak at twice the logits; 2**23 and more add a fifth.
BLOCK_ELEMENTS = 1 << 20


def _logits_of(output: Any) -> torch.Tensor:
    """The logits of a causal-LM forward: a ModelOutput, a dict with ``logits``, or a bare tensor."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    logits = getattr(output, "logits", None)
    if logits is None:
        raise TypeError(f"response_logprobs: the model returned {type(output).__name__} without logits; "
                        "pass a causal LM whose forward returns logits [N, S, V]")
    return logits


def response_logprobs(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor,
                      num_response_tokens: int, temperature: float = 1.0, causal_lm: Optional[bool] = None,
                      share_prompts: bool = False, fixed_forwards: bool = False) -> torch.Tensor:
    """Log-probs that ``model`` gives the last ``num_response_tokens`` tokens of ``sequences``.

    sequences:      LongTensor [N, S], left-padded prompt then right-padded response (``Rollout.sequences``).
    attention_mask: [N, S], 1 on real tokens (``Rollout.attention_mask``).
    Returns FloatTensor [N, R] (float32, R = num_response_tokens): ``log_softmax(logits / temperature)`` at each
    position, gathered at the next token. Entries on padding are meaningless; multiply by the response mask.

    Position ids count real tokens only (``cumsum(mask) - 1``), as a generator does for left-padded prompts, so
    a row gets the same values whatever padding it was batched with. Gradients flow when called outside
    ``torch.no_grad``.

    causal_lm: whether ``model`` takes the keyword arguments of a transformers causal LM (``logits_to_keep``,
    ``past_key_values``); None reads it from ``model.forward``'s signature (say True for a transformers model behind
    a wrapper whose forward takes ``**kwargs``). share_prompts: with a causal LM, adjacent rows with equal prompts
    (the samples of a group) share one forward of their prompt (`coati_relay.inference.prompt_sharing`); the values are
    those of the full forward up to float rounding. fixed_forwards: with share_prompts, two forwards whatever the
    data (`prompt_sharing.shared_prompt_logits`'s ``always``).
    """
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2 or sequences.dtype != torch.long:
        raise TypeError("response_logprobs: sequences must be a LongTensor [N, S], got "
                        f"{getattr(sequences, 'dtype', type(sequences).__name__)} "
                        f"of shape {tuple(getattr(sequences, 'shape', ()))}")
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != sequences.shape:
        raise ValueError(f"response_logprobs: attention_mask must have the shape of sequences "
                         f"{tuple(sequences.shape)}, got {tuple(getattr(attention_mask, 'shape', ()))}")
    seq_len = sequences.size(1)
    if isinstance(num_response_tokens, bool) or not isinstance(num_response_tokens, int) \
            or not 0 < num_response_tokens < seq_len:
        raise ValueError(f"response_logprobs: num_response_tokens must be an int in [1, {seq_len - 1}] "
                         f"(sequences have {seq_len} columns and need a prompt), got {num_response_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"response_logprobs: temperature must be > 0, got {temperature}; "
                         "greedy rollouts carry the log-probs of the temperature-1 distribution, use 1.0")
    if causal_lm is None:
        causal_lm = "logits_to_keep" in inspect.signature(model.forward).parameters
    logits = shared_prompt_logits(model, sequences, attention_mask, num_response_tokens, always=fixed_forwards) \
        if causal_lm and share_prompts else None
    if logits is None:
        mask = attention_mask.long()
        kwargs = {"input_ids": sequences, "attention_mask": mask, "position_ids": real_positions(mask)}
        # Only the logits that predict response tokens are needed: [N, R + 1, V] instead of [N, S, V]; and no
        # key/value cache, which nothing reads (and which gradient checkpointing turns off with a warning).
        if causal_lm:
            kwargs.update(logits_to_keep=num_response_tokens + 1, use_cache=False)
        logits = _logits_of(model(**kwargs))
    return chosen_logprobs(logits, sequences[:, -num_response_tokens:], temperature, own_logits=True)


def chosen_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                    own_logits: bool = False) -> torch.Tensor:
    """``log_softmax(logits[:, K-R-1 : K-1] / temperature)`` gathered at ``targets``, in vocabulary blocks.

    logits: [N, K, V] (any float dtype), K >= R + 1: the last position predicts nothing and is skipped.
    targets: LongTensor [N, R]. Returns FloatTensor [N, R] (float32), the same values as the one-shot expression.
    Under autograd only ``logits`` and an [N, R] normaliser are kept for the backward, which recomputes each
    block's softmax; the gradient comes back as one tensor of the logits' shape (zero at unused positions).
    own_logits: nothing else reads ``logits`` after this call (a model output made for it): the backward writes the
    gradient over them instead of into a new tensor of their size (on a 152k vocabulary, 16 rows of 33 positions:
    321 MB less at the backward's start).
    """
    return _ChosenLogProbs.apply(logits, targets, float(temperature), own_logits)


def _blocks(n: int, r: int, v: int) -> List[Tuple[slice, slice]]:
    """(rows, positions) blocks covering [n, r] with at most ``BLOCK_ELEMENTS`` logits each (at least one row)."""
    if r * v <= BLOCK_ELEMENTS:
        step = BLOCK_ELEMENTS // (r * v)
        return [(slice(i, i + step), slice(0, r)) for i in range(0, n, step)]
    step = max(1, BLOCK_ELEMENTS // v)
    return [(slice(i, i + 1), slice(j, j + step)) for i in range(n) for j in range(0, r, step)]


class _ChosenLogProbs(torch.autograd.Function):
    """Forward: per block, ``log_softmax(x / t).gather(targets)`` and the normaliser ``logsumexp(x / t)`` [N, R].
    Backward: per block, ``(onehot(targets) - exp(x / t - normaliser)) * grad / t``, over the logits where the
    caller owns them."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                own_logits: bool) -> torch.Tensor:
        n, k, v = logits.shape
        r = targets.size(1)
        start = k - r - 1
        out = torch.empty(n, r, dtype=torch.float32, device=logits.device)
        norm = torch.empty_like(out)
        for rows, pos in _blocks(n, r, v):
            x = logits[rows, start + pos.start: start + min(pos.stop, r)].float()
            if temperature != 1.0:
                x = x / temperature
            tgt = targets[rows, pos].unsqueeze(-1)
            chosen = x.gather(-1, tgt).squeeze(-1)
            out[rows, pos] = torch.log_softmax(x, dim=-1).gather(-1, tgt).squeeze(-1)
            norm[rows, pos] = chosen - out[rows, pos]
        ctx.save_for_backward(logits, targets, norm)
        ctx.temperature, ctx.own_logits = temperature, own_logits
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, targets, norm = ctx.saved_tensors
        t = ctx.temperature
        n, k, v = logits.shape
        r = targets.size(1)
        start = k - r - 1
        if ctx.own_logits:  # each block is read before it is written; the positions no block covers are zeroed
            grad = logits
            grad[:, :start].zero_()
            grad[:, start + r:].zero_()
        else:
            grad = torch.zeros_like(logits)
        for rows, pos in _blocks(n, r, v):
            cols = slice(start + pos.start, start + min(pos.stop, r))
            x = logits[rows, cols].float()
            if t != 1.0:
                x = x / t
            g = grad_out[rows, pos].unsqueeze(-1)
            block = torch.exp(x - norm[rows, pos].unsqueeze(-1)).mul_(-g)
            block.scatter_add_(-1, targets[rows, pos].unsqueeze(-1), g)
            if t != 1.0:
                block.div_(t)
            grad[rows, cols] = block
        return grad, None, None, None
