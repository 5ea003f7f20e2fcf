"""The legacy maker's sampling on the engine's backends (transformers on the actor's own module, vLLM), with
``Actor.generate``'s signature and the legacy loop's contract: left-padded prompts, ``max_length`` counting prompt and
response, sampling only, rows stopped only at ``eos_token_id`` and padded with ``pad_token_id``, ``early_stopping``
ending at the longest response once every row of every rank stopped. Other random streams (``top_k=1``: the same).

The vLLM engine starts beside the maker's four models: on CUDA in the actor's dtype, with a share of the memory free
then (`maker_engine_kwargs`); where that share is too small for it, the maker samples with transformers on the actor
itself, with one warning. On the CPU it runs in float32 (the faster dtype there)."""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Iterable, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from coati_compat.legacy.generation import check_generate_args
from coati_compat.legacy.model_base import generated_masks
from coati_relay.parts import (
    DEFAULT_MAX_MODEL_LEN,
    NoRoomForEngine,
    SamplingConfig,
    accelerator_device,
    backend_spec,
    build_backend_on_module,
    kv_bytes_per_token,
    module_weights,
    parameter_bytes,
    resolve_backend_name,
    shared_gpu_engine_kwargs,
)

SAMPLERS, SAMPLER_ENV = ("auto", "vllm", "transformers", "legacy"), "COATI_RELAY_MAKER_SAMPLER"
# Share of the memory free beside the maker's models that its vLLM engine takes; the rest: the experience step's
# forwards of actor, critic, reward model and initial model on each batch, while the engine holds its share.
MAKER_ENGINE_SHARE_OF_FREE = 0.7


def default_sampler() -> str:
    """The sampler of a maker whose script names none: ``$COATI_RELAY_MAKER_SAMPLER``, else ``"auto"``."""
    return os.environ.get(SAMPLER_ENV) or "auto"


def resolve_sampler(name: str, model: nn.Module) -> str:
    """``auto``: vLLM where it runs ``model``'s architecture, else transformers; ``legacy``: the legacy loop."""
    if name not in SAMPLERS:
        raise ValueError(f"sampler (or ${SAMPLER_ENV}) must be one of {list(SAMPLERS)}, got {name!r}")
    return name if name == "legacy" else resolve_backend_name(name, type(model).__name__)


def device_memory(device: torch.device) -> Optional[Tuple[int, int]]:
    """(free, total) bytes of a CUDA ``device`` (every process's use counted, this one's cache returned first);
    None for another device."""
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)


def maker_engine_kwargs(model: nn.Module) -> Dict[str, Any]:
    """The keywords of the maker's vLLM engine on ``model`` (the actor's HF module): eager (it starts in seconds)
    and, on a CUDA host, the actor's dtype (bf16/fp16 where the strategy made the models half) and
    `MAKER_ENGINE_SHARE_OF_FREE` of the memory free now, beside the maker's models (vLLM's default 0.9 of the device
    does not fit there). Raises `NoRoomForEngine` where that share cannot hold the weights, a KV cache for one
    sequence of the engine's longest length, and the engine's working memory."""
    param = next(model.parameters())
    memory = device_memory(accelerator_device())  # where vLLM runs: CUDA wherever the host has it
    if memory is None:
        return {"enforce_eager": True}
    config = model.config
    max_len = min(DEFAULT_MAX_MODEL_LEN, getattr(config, "max_position_embeddings", None) or DEFAULT_MAX_MODEL_LEN)
    settings = shared_gpu_engine_kwargs(param.dtype, parameter_bytes(model, param.dtype),
                                        kv_bytes_per_token(config, param.dtype) * max_len, *memory,
                                        share=MAKER_ENGINE_SHARE_OF_FREE)
    return {"enforce_eager": True, **settings}


class EngineSampler:
    """Samples for one maker with the backend ``kind`` started on the actor's HF module at the first call: the module
    itself (transformers), or a vLLM engine started from its weights (LoRA folded) and given each push's (`load`).
    A vLLM engine without room on the device (`maker_engine_kwargs`) makes ``kind`` ``"transformers"``."""

    def __init__(self, kind: str, seed: int = 0):
        self.kind, self.seed, self.backend = kind, seed, None

    def start(self, model: nn.Module, version: int = 0):
        """The backend, started on ``model`` at ``version`` if none yet (EOS and padding come with each call)."""
        if self.backend is None:
            engine: Dict[str, Any] = {}
            if not backend_spec(self.kind).generates_in_place:
                try:
                    engine = maker_engine_kwargs(model)
                except NoRoomForEngine as e:
                    warnings.warn(f"the maker's vLLM engine does not fit beside its models on "
                                  f"{accelerator_device()}: {e}; sampling with transformers on the "
                                  f"actor itself instead", RuntimeWarning, stacklevel=2)
                    self.kind = "transformers"
            self.backend = build_backend_on_module(self.kind, model, SamplingConfig(), seed=self.seed,
                                                   eos_token_ids=[], pad_token_id=0, **engine)
            self.backend.weight_version = version
        return self.backend

    def load(self, model: nn.Module, names: Iterable[str]) -> None:
        """Weights ``names`` a push loaded into ``model``, into a started vLLM engine (transformers reads ``model``)."""
        tensors = module_weights(model, names) if self.backend is not None and not self.backend.shared else None
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

