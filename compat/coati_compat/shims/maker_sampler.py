"""The legacy maker's sampling on an engine `InferenceBackend` (vLLM, or transformers' ``generate``).

`EngineSampler.generate` has ``Actor.generate``'s signature and keeps the legacy sampling contract of
``coati.models.generation.generate``: left-padded prompts [B,P] (the attention mask, when given, marks the padding;
without one every token is a prompt token, as the legacy loop attended to all), ``max_length`` counting prompt plus
response, sampling only (``do_sample=True``), temperature then top-k then top-p, rows stopped at ``eos_token_id``
(and only at it: the checkpoint's own EOS ids do not stop a row) and padded with ``pad_token_id`` after it, and
``early_stopping`` ending the batch at its longest response once every row has stopped (else every row runs to
``max_length``). Sequences come back as [B, P + width], the prompts unchanged in front.

The engine starts on the first call from the actor's weights as they are then (LoRA layers merged), and before each
later call it reloads them when the maker's weight version moved (a push ended). `sampler_weights` is the one place
that turns the actor's model into the Hugging Face weights a sampler loads.

The random streams are the engine's, not ``torch.multinomial``'s: the same distribution, other samples (see
migration_guide/deviations.md); ``top_k=1`` makes both deterministic and equal.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from coati_compat.legacy.generation import check_generate_args
from coati_compat.legacy.lora import LoraLinear
from coati_compat.legacy.model_base import generated_masks
from coati_relay.weight_sync import replace_delta

logger = logging.getLogger(__name__)

SAMPLERS = ("auto", "vllm", "transformers", "legacy")
SAMPLER_ENV = "COATI_RELAY_MAKER_SAMPLER"  # the sampler of makers built without ``sampler=`` (default: auto)


def default_sampler() -> str:
    """The sampler of a maker whose script names none: ``$COATI_RELAY_MAKER_SAMPLER``, else ``"auto"`` (vLLM where it
    runs the actor's architecture, transformers otherwise)."""
    return os.environ.get(SAMPLER_ENV) or "auto"


def sampler_weights(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The Hugging Face weights of ``model`` as a sampler must hold them: each LoRA layer's ``W + scaling * B @ A``
    (in ``nn.Linear``'s [out, in] layout) under its own name, the adapter tensors left out; float32 CPU copies."""
    out = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()
           if not k.endswith((".lora_A", ".lora_B"))}
    for name, layer in model.named_modules():
        if isinstance(layer, LoraLinear):
            weight = layer.weight.detach()
            if layer.r > 0 and not layer.merged:
                weight = replace_delta(weight, layer.delta_weight().detach())
            out[f"{name}.weight"] = layer._t(weight).float().cpu().clone()
    return out


def _write_checkpoint(model: nn.Module, directory: str) -> None:
    """``config.json`` and ``model.safetensors`` of ``model`` (its `sampler_weights`), written by this process
    whatever its rank (transformers' ``save_pretrained`` writes on rank 0 only, and a maker may be rank 1), and an
    id tokenizer: the maker hands the engine token ids and reads token ids back, but vLLM starts only with a
    tokenizer (one token ``t<i>`` per id of the model's vocabulary, the config's pad and EOS ids as its own)."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    config = json.loads(model.config.to_json_string(use_diff=False))
    config["architectures"] = [type(model).__name__]  # a model built from a config may name none (vLLM then pools)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    save_file(sampler_weights(model), os.path.join(directory, "model.safetensors"))
    size = model.config.vocab_size
    vocab = {f"t{i}": i for i in range(size)}

    def token(key: str) -> str:  # the model's own special id where it names one, else t0
        value = getattr(model.config, key, None)
        return f"t{value}" if isinstance(value, int) and 0 <= value < size else "t0"

    ids = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")),
                                  pad_token=token("pad_token_id"), eos_token=token("eos_token_id"))
    ids.save_pretrained(directory)


def vllm_supports(model: nn.Module) -> bool:
    """True when vLLM is installed and knows the architecture of ``model``'s config."""
    if importlib.util.find_spec("vllm") is None:
        return False
    from vllm import ModelRegistry

    return type(model).__name__ in ModelRegistry.get_supported_archs()


def resolve_sampler(name: str, model: nn.Module) -> str:
    """``auto``: vLLM where it supports the model, transformers otherwise; other names are checked and kept."""
    if name not in SAMPLERS:
        raise ValueError(f"sampler (or ${SAMPLER_ENV}) must be one of {list(SAMPLERS)}, got {name!r} ('legacy' is "
                         "the old token-by-token loop)")
    if name == "vllm" and not vllm_supports(model):
        raise ValueError(f"sampler='vllm': the installed vLLM cannot run {type(model).__name__} (or is missing); use "
                         "sampler='transformers' or 'auto'")
    if name == "auto":
        return "vllm" if vllm_supports(model) else "transformers"
    return name


class EngineSampler:
    """Samples for one maker with an engine backend of kind ``kind`` ("vllm" or "transformers").

    The backend holds its own copy of the weights, started from a temporary checkpoint written on the first call.
    ``seed`` seeds the backend's stream of per-call seeds.
    """

    def __init__(self, kind: str, seed: int = 0, **backend_kwargs: Any):
        if kind not in ("vllm", "transformers"):
            raise ValueError(f"EngineSampler: kind must be 'vllm' or 'transformers', got {kind!r}")
        self.kind, self.seed, self.backend_kwargs = kind, seed, backend_kwargs
        self.backend = None
        self.version: Optional[int] = None

    def _start(self, model: nn.Module, version: int) -> None:
        from coati_relay.inference import SamplingConfig, build_inference_backend

        kwargs = dict(self.backend_kwargs)
        if self.kind == "vllm":
            kwargs.setdefault("enforce_eager", True)  # starts in seconds; the maker's batches are small
        checkpoint = tempfile.mkdtemp(prefix="coati-relay-maker-")
        try:  # the engine reads the weights once; later loads go from memory
            _write_checkpoint(model, checkpoint)
            self.backend = build_inference_backend(self.kind, checkpoint, SamplingConfig(), seed=self.seed, **kwargs)
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)
        self.version = version
        logger.info("maker sampler: %s engine on the actor's weights (version %d)", self.kind, version)

    def sync(self, model: nn.Module, version: int) -> None:
        """Starts the engine, or loads the actor's weights into it when ``version`` differs from what it holds."""
        if self.backend is None:
            self._start(model, version)
        elif version != self.version:
            self.backend.load_weights(self.backend.weight_version + 1, sampler_weights(model))
            self.version = version

    @torch.no_grad()
    def generate(self, model: nn.Module, version: int, input_ids: torch.Tensor, return_action_mask: bool = True,
                 max_length: int = 0, num_beams: int = 1, do_sample: bool = True, early_stopping: bool = False,
                 eos_token_id: Optional[int] = None, pad_token_id: Optional[int] = None, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, temperature: Optional[float] = None, **model_kwargs: Any
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """As ``Actor.generate`` with the legacy loop, sampled by the engine on ``model``'s weights of ``version``.
        input_ids: [B,P]. Returns (sequences [B,S], attention_mask [B,S] or None, action_mask [B,S-P] or None)."""
        from coati_relay.inference import SamplingConfig

        attention_mask = check_generate_args(max_length, num_beams, do_sample, eos_token_id, pad_token_id,
                                             model_kwargs)
        width = max_length - input_ids.size(1)
        if width <= 0:
            return generated_masks(input_ids, input_ids.size(1), pad_token_id, eos_token_id, return_action_mask)
        self.sync(model, version)
        rows = input_ids.cpu()
        if attention_mask is None:
            prompts = rows.tolist()
        else:
            prompts = [r[k].tolist() for r, k in zip(rows, attention_mask.cpu().bool())]
        self.backend.sampling = SamplingConfig(
            max_new_tokens=width, temperature=1.0 if temperature is None else float(temperature),
            top_k=int(top_k) if top_k else -1, top_p=1.0 if top_p is None else float(top_p), ignore_eos=True,
            stop_token_ids=[] if eos_token_id is None else [int(eos_token_id)])
        rollout = self.backend.generate(prompts, 1)
        responses = self._pad_responses(rollout.response_ids, rollout.response_lengths, width, early_stopping,
                                        eos_token_id, pad_token_id)
        sequences = torch.cat([input_ids, responses.to(input_ids.device)], dim=1)
        return generated_masks(sequences, input_ids.size(1), pad_token_id, eos_token_id, return_action_mask)

    @staticmethod
    def _pad_responses(ids: torch.Tensor, lengths: torch.Tensor, width: int, early_stopping: bool,
                       eos_token_id: Optional[int], pad_token_id: Optional[int]) -> torch.Tensor:
        """[B, W] responses as the legacy loop leaves them: W = ``width`` unless ``early_stopping`` and every row
        (of every data-parallel rank) stopped at EOS, then the longest response; after a row's end, ``pad``."""
        ended = torch.tensor([eos_token_id is not None and n > 0 and int(r[n - 1]) == eos_token_id
                              for r, n in zip(ids, lengths.tolist())])
        out_width = width
        if early_stopping and eos_token_id is not None:
            if bool(ended.all()):
                out_width = int(lengths.max())
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                w = torch.tensor(out_width)
                dist.all_reduce(w, op=dist.ReduceOp.MAX)
                out_width = int(w)
        out = ids.new_full((ids.size(0), out_width), 0 if pad_token_id is None else pad_token_id)
        for i, n in enumerate(lengths.tolist()):
            n = min(n, out_width)
            out[i, :n] = ids[i, :n]
        return out

    def close(self) -> None:
        """Stops the engine; the next call starts a new one."""
        close = getattr(self.backend, "close", None)
        if close:
            close()
        self.backend = None
