"""A tied input embedding's gradient as the batch's rows, not a vocabulary-sized tensor.

A causal LM that ties its input embedding to its output projection (Qwen2.5 0.5B-3B, Llama 3.2 1B and 3B) uses one
[V, H] parameter twice; autograd sums the two gradients before they reach the parameter. The embedding's part is
dense by default: a [V, H] tensor of zeros with the batch's rows added in (544 MB a backward on a 151,936 x 896
embedding, one per forward that embeds tokens). As a sparse gradient (``nn.Embedding.sparse``) it holds only the
batch's rows, and its sum with the projection's dense gradient is the same dense [V, H] gradient, equal to float
rounding (the rows of repeated tokens are added in another order). On the 494M model of
``benchmarks/real_size.py``, a backward of 4 sequences of 64 tokens peaks 0.5 GB lower.

Only where the parameter's gradient is that sum, which the optimizer and torch's DDP see dense: the embedding is
tied to the output projection and trained. DDP reads ``sparse`` when it is built and would then expect a sparse
gradient, so this is set on the model after wrapping (`TrainingBackend` does, under ``ddp`` and without a plugin).
"""
from __future__ import annotations

from torch import nn


def tied_trainable_embedding(model: nn.Module) -> "nn.Embedding | None":
    """The input embedding of ``model`` (a transformers model, unwrapped) where it is an ``nn.Embedding`` whose
    trainable weight is also the output projection's; else None."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return None
    embedding, projection = get_in(), get_out()
    if not isinstance(embedding, nn.Embedding) or projection is None or not embedding.weight.requires_grad:
        return None
    return embedding if getattr(projection, "weight", None) is embedding.weight else None


def sparse_tied_embedding_gradient(model: nn.Module) -> bool:
    """Makes the tied input embedding of ``model`` give its part of the gradient as rows (see the module); True
    where it did."""
    embedding = tied_trainable_embedding(model)
    if embedding is None:
        return False
    embedding.sparse = True
    return True
