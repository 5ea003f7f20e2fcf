"""`InferenceBackend` on a transformers causal LM: the fallback where vLLM is missing or lacks the model.

Generation is the prefill of each distinct prompt once (`coati_relay.inference.prompt_sharing`), then
`coati_relay.inference.decode_loop`: one forward per token over a preallocated cache, finished rows leaving the batch.
The forward is `coati_relay.inference.fused_step.FusedStep` for the Llama family (``fused_decode``, on by default),
else the model's own. It samples as transformers' ``generate`` does (same processors, same draws while every row is
in the batch). With ``compiled_decode`` the decode runs `coati_relay.inference.captured_decode` instead: the same
one-token step compiled over a static cache, the same draws while the loop keeps every row.

Behaviour log-probs are those of the distribution actually sampled from: the logits after the temperature, top-k
and top-p processors, each sampled token getting its ``log_softmax``. With top-k/top-p that is the renormalised
truncated distribution (tokens outside it have probability 0), as vLLM reports in ``processed_logprobs`` mode;
recomputing with `coati_relay.roles.logprobs.response_logprobs` (which applies temperature only) matches exactly when
top-k
and top-p are off. Greedy decoding (temperature 0) reports the log-probs of the untempered distribution.
"""
from __future__ import annotations

import logging
from typing import Dict, Optional, Sequence

import torch

from coati_relay.cluster.devices import resolve_device, to_device, to_host
from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.prompt_sharing import prefill_shared
from coati_relay.inference.rollout_building import (
    SeedSequence,
    build_rollout,
    check_info,
    check_prompts,
    check_sampling,
    check_weight_update,
    pad_prompts,
    special_token_ids,
    stop_token_ids,
)
from coati_relay.rollout import Rollout

logger = logging.getLogger(__name__)


class TransformersBackend:
    """Generates with a transformers causal LM held in this process: its own copy loaded from ``model_path``, or
    (`around`) the very module a consumer trains, whose parameters it reads in place.

    model_path: a local HF checkpoint; sampling: the `SamplingConfig` (may be replaced between calls through
    ``backend.sampling``); tokenizer: an object, a path, or None for the checkpoint's own; seed: seeds the stream of
    per-call seeds used when ``sampling.seed`` is None (with ``sampling.seed`` set, every call uses that seed);
    device: where the model runs (None: the accelerator where the host has one, else the CPU).
    The checkpoint's ``generation_config.json`` is not used: sampling follows ``sampling`` alone.
    fused_decode: decode Llama-family models (Llama, Qwen2, Mistral) through
    `coati_relay.inference.fused_step.FusedStep` (0.80-0.88x the time per token of the model's forward on the CPU);
    other models, and False, use the model's own forward.
    compiled_decode: decode through `coati_relay.inference.captured_decode` (the step compiled once per shape bucket
    over a static cache) instead of the loop; off by default: on the CPU its compilation does not pay within a short
    run (benchmarks/README.md).
    """

    def __init__(self, model_path: str, sampling: SamplingConfig, tokenizer=None, device: Optional[str] = None,
                 dtype: torch.dtype = torch.float32, seed: int = 0, attn_implementation: Optional[str] = None,
                 fused_decode: bool = True, compiled_decode: bool = False):
        from transformers import AutoModelForCausalLM

        device = resolve_device(device)
        extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype, **extra).to(device).eval()
        self._attach(model, model_path, sampling, tokenizer, device, seed, shared=False)
        self._capture(fused_decode, compiled_decode)

    @classmethod
    def around(cls, model: torch.nn.Module, model_path: Optional[str], sampling: SamplingConfig, tokenizer=None,
               seed: int = 0, *, eos_token_ids: Optional[Sequence[int]] = None,
               pad_token_id: Optional[int] = None, fused_decode: bool = True,
               compiled_decode: bool = False) -> "TransformersBackend":
        """A backend generating with ``model`` itself (a transformers causal LM being trained, or pushed to,
        elsewhere in this process): no copy; each `generate` puts it in eval mode under ``no_grad`` and restores its
        mode after. ``model_path``: the checkpoint it was loaded from (its EOS ids and tokenizer), or None with
        ``eos_token_ids`` (the ids that stop a response; [] for none) and ``pad_token_id`` (padding only) given.
        fused_decode, compiled_decode: as for the constructor."""
        backend = cls.__new__(cls)
        backend._attach(model, model_path, sampling, tokenizer, next(model.parameters()).device, seed, shared=True,
                        eos_token_ids=eos_token_ids, pad_token_id=pad_token_id)
        backend._capture(fused_decode, compiled_decode)
        return backend

    def _attach(self, model: torch.nn.Module, model_path: Optional[str], sampling: SamplingConfig, tokenizer,
                device: torch.device, seed: int, shared: bool, eos_token_ids: Optional[Sequence[int]] = None,
                pad_token_id: Optional[int] = None) -> None:
        self.sampling = sampling
        self.device = device
        self.shared = shared
        self.sleeps = False
        self.model = model
        self.tokenizer, self._eos_ids, self.pad_token_id, self.eos_token_id = special_token_ids(
            model_path, tokenizer, model.config, eos_token_ids, pad_token_id)
        self._params = self.model.state_dict(keep_vars=True)
        self._shapes = {k: v.shape for k, v in self._params.items()}
        self._vocab_size = self.model.get_input_embeddings().num_embeddings
        self._max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self._seeds = SeedSequence(seed)
        self.weight_version = 0
        self.step = None  # the decode loop's one-token forward (fused_step.ModelStep or FusedStep)
        self.captured = None  # a CapturedDecoder: decode through a compiled step (compiled_decode)

    def _capture(self, fused_decode: bool, compiled_decode: bool) -> None:
        from coati_relay.inference.fused_step import decode_step  # imports transformers: not at import

        self.step = decode_step(self.model, fused_decode)
        if compiled_decode:
            from coati_relay.inference.captured_decode import CapturedDecoder

            self.captured = CapturedDecoder(self.step)

    @property
    def sampling(self) -> SamplingConfig:
        return self._sampling

    @sampling.setter
    def sampling(self, value: SamplingConfig) -> None:
        if check_sampling(value).options:
            raise ValueError(f"TransformersBackend: SamplingConfig.options {sorted(value.options)} are vllm."
                             "SamplingParams keywords; the transformers backend runs none of them")
        self._sampling = value

    def generate(self, prompts: Sequence[Sequence[int]], n: int, info: Optional[Dict[str, list]] = None) -> Rollout:
        """Samples ``n`` responses per prompt. Rows are prompt-major; R is the longest response of this call."""
        from coati_relay.inference.decode_loop import StopStrings, decode  # imports transformers: not at import

        if self.model is None:
            raise RuntimeError("TransformersBackend.generate: the backend was closed; build a new one")
        s = self.sampling
        max_prompt = self._max_positions - s.max_new_tokens if self._max_positions else None
        prompts = check_prompts(prompts, n, self._vocab_size, max_prompt)
        info = check_info(info, len(prompts))
        stop_ids = stop_token_ids(s, self._eos_ids)
        stop_strings = StopStrings(self.tokenizer, s.stop_strings) if s.stop_strings else None
        prompt_ids, prompt_mask = pad_prompts(prompts, self.pad_token_id)
        ids, mask = to_device(self.device, prompt_ids, prompt_mask)
        rows = torch.arange(ids.size(0), device=self.device).repeat_interleave(n)
        fork_devices = [self.device] if self.device.type == "cuda" else []
        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=fork_devices):
                torch.manual_seed(self._seeds.next(s))
                self.step.refresh()
                if self.captured is not None:
                    prefilled = prefill_shared(self.model, ids, mask, rows) if ids.size(1) >= 2 else None
                    out = self.captured.decode(prefilled, ids[rows, -1], mask[rows], s, stop_ids, self.pad_token_id,
                                               stop_strings)
                    del prefilled
                else:
                    cache = self._prefill(ids, mask, rows, ids.size(1) - 1 + s.max_new_tokens)
                    out = decode(self.step, cache, ids[rows, -1], mask[rows], s, stop_ids, self.pad_token_id,
                                 stop_strings)
                    del cache
        finally:
            self.model.train(training)
        return build_rollout(prompt_ids, prompt_mask, n, to_host(out.tokens), to_host(out.logprobs),
                             to_host(out.lengths), stop_ids, self.pad_token_id, self.weight_version, info)

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, capacity: int):
        """The preallocated cache (``capacity`` positions) of every prompt column but the last, each distinct prompt
        computed once and repeated to its rows (`coati_relay.inference.prompt_sharing`): the prefill costs P instead
        of n * P token-forwards a prompt. ids, mask: [B, P] distinct prompts; rows: LongTensor [N], the prompt of each
        row. Empty when P = 1."""
        from coati_relay.inference.decode_loop import preallocated_cache

        layers = self.model.config.get_text_config().num_hidden_layers
        prefilled = prefill_shared(self.model, ids, mask, rows) if ids.size(1) >= 2 else None
        return preallocated_cache(prefilled, layers, capacity)

    def load_weights(self, version: int, tensors: Dict[str, torch.Tensor]) -> None:
        """Copies the named weights (HF names, any subset) into the model and records ``version``. A shared backend
        (generating with a model trained in this process) takes a version with no tensors: its model holds it."""
        if self.model is None:
            raise RuntimeError("TransformersBackend.load_weights: the backend was closed; build a new one")
        if self.shared:
            if tensors:
                raise RuntimeError("TransformersBackend.load_weights: this backend generates with a model trained in "
                                   "this process and reads its weights in place; update that model instead (and "
                                   "load the version with no tensors)")
            self.weight_version = version
            return
        check_weight_update(tensors, self._shapes, version, type(self).__name__)
        with torch.no_grad():
            for name, t in tensors.items():
                self._params[name].copy_(t)
        self.weight_version = version
        logger.debug("loaded %d tensors as weight version %d", len(tensors), version)

    def sleep(self) -> None:
        """Frees what decoding holds beside the model (the fused step's concatenated projections, the captured path's
        buckets) while a colocated run trains; the next `generate` makes them again. The model stays where it is, so
        no `wake_up` is needed (``sleeps`` is False)."""
        if self.step is not None:
            self.step.release()
        if self.captured is not None:
            self.captured.release()

    def wake_up(self) -> None:
        """Nothing to take back (``sleeps`` is False)."""

    def close(self) -> None:
        """Drops the model (a shared one stays with its owner); the backend cannot generate afterwards."""
        self.model = self.step = self.captured = None
        self._params = {}
