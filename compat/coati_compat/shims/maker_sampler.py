"""The legacy maker's sampling on the engine's backends (transformers on the actor's own module, vLLM), with
``Actor.generate``'s signature and the legacy loop's contract: left-padded prompts, ``max_length`` counting prompt and
response, sampling only, rows stopped only at ``eos_token_id`` and padded with ``pad_token_id``, ``early_stopping``
ending at the longest response once every row of every rank stopped. Other random streams (``top_k=1``: the same)."""
from __future__ import annotations

import os
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from coati_compat.legacy.generation import check_generate_args
from coati_compat.legacy.model_base import generated_masks
from coati_relay.inference import SamplingConfig, build_backend_on_module, resolve_backend_name
from coati_relay.inference.module_checkpoint import module_weights

SAMPLERS, SAMPLER_ENV = ("auto", "vllm", "transformers", "legacy"), "COATI_RELAY_MAKER_SAMPLER"


def default_sampler() -> str:
    """The sampler of a maker whose script names none: ``$COATI_RELAY_MAKER_SAMPLER``, else ``"auto"``."""
    return os.environ.get(SAMPLER_ENV) or "auto"


def resolve_sampler(name: str, model: nn.Module) -> str:
    """``auto``: vLLM where it runs ``model``'s architecture, else transformers; ``legacy``: the legacy loop."""
    if name not in SAMPLERS:
        raise ValueError(f"sampler (or ${SAMPLER_ENV}) must be one of {list(SAMPLERS)}, got {name!r}")
    return name if name == "legacy" else resolve_backend_name(name, type(model).__name__)


class EngineSampler:
    """Samples for one maker with the backend ``kind`` started on the actor's HF module at the first call: the module
    itself (transformers), or a vLLM engine started from its weights (LoRA folded) and given each push's (`load`)."""

    def __init__(self, kind: str, seed: int = 0):
        self.kind, self.seed, self.backend = kind, seed, None

    def start(self, model: nn.Module, version: int = 0):
        """The backend, started on ``model`` at ``version`` if none yet (EOS and padding come with each call)."""
        if self.backend is None:
            eager = {"enforce_eager": True} if self.kind == "vllm" else {}  # vLLM starts in seconds
            self.backend = build_backend_on_module(self.kind, model, SamplingConfig(), seed=self.seed,
                                                   eos_token_ids=[], pad_token_id=0, **eager)
            self.backend.weight_version = version
        return self.backend

    def load(self, model: nn.Module, names: Iterable[str]) -> None:
        """Weights ``names`` a push loaded into ``model``, into a started vLLM engine (transformers reads ``model``)."""
        tensors = module_weights(model, names) if self.kind == "vllm" and self.backend else None
        if tensors:  # the version moves at the push's end
            self.backend.load_weights(self.backend.weight_version, tensors)

    @torch.no_grad()
    def generate(self, model: nn.Module, input_ids: torch.Tensor, return_action_mask: bool = True,
                 max_length: int = 0, num_beams: int = 1, do_sample: bool = True, early_stopping: bool = False,
                 eos_token_id: Optional[int] = None, pad_token_id: Optional[int] = None, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, temperature: Optional[float] = None, **model_kwargs: Any):
        """``Actor.generate`` on ``model``. input_ids: [B,P] -> (sequences [B,S], attention mask, action mask)."""
        mask = check_generate_args(max_length, num_beams, do_sample, eos_token_id, pad_token_id, model_kwargs)
        width, pad, eos, seq = max_length - input_ids.size(1), pad_token_id or 0, eos_token_id, input_ids
        if width > 0:
            self.start(model).sampling = SamplingConfig(
                width, 1.0 if temperature is None else float(temperature), int(top_k or -1), float(top_p or 1.0),
                stop_token_ids=[] if eos is None else [int(eos)], ignore_eos=True)
            keep = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
            r = self.backend.generate([p[k].tolist() for p, k in zip(input_ids.cpu(), keep.cpu())], 1)
            n, ids = r.response_lengths, r.response_ids.masked_fill(~r.response_mask, pad)
            if early_stopping and eos is not None:  # every row ended at EOS: the longest response
                width = torch.where(((n > 0) & (ids.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0] == eos)).all(),
                                    n.max(), width)
                if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                    dist.all_reduce(width, op=dist.ReduceOp.MAX)
            seq = torch.cat([input_ids, F.pad(ids, (0, int(width) - ids.size(1)), value=pad).to(input_ids.device)], 1)
        return generated_masks(seq, input_ids.size(1), pad_token_id, eos_token_id, return_action_mask)

