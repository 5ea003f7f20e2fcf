"""Masked reductions over padded token tensors.

``mask`` is 1/True on valid positions; it is broadcast against ``x`` (e.g. advantages ``[B,1]`` with a ``[B,T]``
mask), so padded positions never enter a sum, a mean or a variance.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch


def _broadcast(x: torch.Tensor, mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(x, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise TypeError(f"expected tensors, got x={type(x).__name__}, mask={type(mask).__name__}")
    try:
        return torch.broadcast_tensors(x, mask.to(x.dtype))
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast against x of shape "
                         f"{tuple(x.shape)}; pass a mask with x's shape") from None


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """``sum(x * m)`` over ``dim`` (all elements when None). x: [..], mask: broadcastable to x."""
    x, m = _broadcast(x, mask)
    return (x * m).sum() if dim is None else (x * m).sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None, eps: float = 1e-8) -> torch.Tensor:
    """``sum(x * m) / (sum(m) + eps)`` over ``dim`` (all elements when None); the legacy form, eps 1e-8.

    x: [..], mask: broadcastable to x. A row with no valid position gives 0.
    """
    x, m = _broadcast(x, mask)
    if dim is None:
        return (x * m).sum() / (m.sum() + eps)
    return (x * m).sum(dim=dim) / (m.sum(dim=dim) + eps)


def masked_var(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Population variance of the valid entries: ``masked_mean((x - masked_mean(x))^2)``. Scalar."""
    mean = masked_mean(x, mask, eps=eps)
    return masked_mean((x - mean) ** 2, mask, eps=eps)


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mu) / sqrt(var + eps)`` with mu, var the masked mean and population variance over all valid entries.

    x: [B,T] (any shape), mask: broadcastable to x. Returns x's shape; masked positions are 0.
    """
    x_b, m = _broadcast(x, mask)
    mean = masked_mean(x_b, m, eps=eps)
    return (x_b - mean) * torch.rsqrt(masked_var(x_b, m, eps=eps) + eps) * m


def whiten_over_ranks(x: torch.Tensor, mask: torch.Tensor, all_reduce: Callable[[torch.Tensor], torch.Tensor],
                      eps: float = 1e-8) -> torch.Tensor:
    """`whiten` with the mean and population variance of the valid entries of every data-parallel rank's ``x``.

    all_reduce: sums a float64 tensor [3] (sum, sum of squares, count of this rank's valid entries) over the ranks
    (`coati_relay.training.distributed.all_reduce_sum`; the identity for one rank, which gives `whiten`). A
    collective: every rank calls it. x: [B,T] (any shape), mask: broadcastable to x. Returns x's shape; masked
    positions are 0.
    """
    x_b, m = _broadcast(x, mask)
    x64, m64 = x_b.double(), m.double()
    total, total_sq, count = all_reduce(torch.stack([(x64 * m64).sum(), (x64 * x64 * m64).sum(), m64.sum()]))
    mean = total / (count + eps)
    var = (total_sq / (count + eps) - mean * mean).clamp(min=0.0)
    return ((x64 - mean) * torch.rsqrt(var + eps) * m64).to(x_b.dtype)

