"""Log-probs of sampled response tokens, recomputed by a model (the consumer's view of a rollout)."""
from __future__ import annotations

import inspect
from typing import Any

import torch


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
                      num_response_tokens: int, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs that ``model`` gives the last ``num_response_tokens`` tokens of ``sequences``.

    sequences:      LongTensor [N, S], left-padded prompt then right-padded response (``Rollout.sequences``).
    attention_mask: [N, S], 1 on real tokens (``Rollout.attention_mask``).
    Returns FloatTensor [N, R] (float32, R = num_response_tokens): ``log_softmax(logits / temperature)`` at each
    position, gathered at the next token. Entries on padding are meaningless; multiply by the response mask.

    Position ids count real tokens only (``cumsum(mask) - 1``), as a generator does for left-padded prompts, so
    a row gets the same values whatever padding it was batched with. Gradients flow when called outside
    ``torch.no_grad``.
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
    mask = attention_mask.long()
    position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)
    kwargs = {"input_ids": sequences, "attention_mask": mask, "position_ids": position_ids}
    # Only the logits that predict response tokens are needed: [N, R + 1, V] instead of [N, S, V].
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = num_response_tokens + 1
    logits = _logits_of(model(**kwargs))[:, -(num_response_tokens + 1):-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = sequences[:, -num_response_tokens:].unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1)
