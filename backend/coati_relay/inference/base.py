"""The `InferenceBackend` seam: turn prompt token ids into a `Rollout`, and load new weights between generations."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Sequence, runtime_checkable

import torch

from coati_relay.rollout import Rollout


@dataclass
class SamplingConfig:
    """Sampling parameters shared by every backend.

    top_k <= 0 and top_p == 1.0 disable those filters. ``stop_token_ids`` end a response (the EOS id is always one).
    ``stop_strings``: a response ends once its text holds one of them (vLLM's ``stop``: anywhere in the new text;
    transformers' ``stop_strings``: at its end), the tokens that complete it included. ``do_sample`` False decodes
    greedily (transformers' ``do_sample``). ``options``: further keywords handed unchanged to the backend
    (``vllm.SamplingParams``'s, e.g. ``min_tokens``, ``repetition_penalty``, ``include_stop_str_in_output``).
    """

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: Optional[int] = None
    stop_token_ids: List[int] = field(default_factory=list)
    ignore_eos: bool = False
    stop_strings: List[str] = field(default_factory=list)
    do_sample: bool = True
    options: Dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class InferenceBackend(Protocol):
    """Generates rollouts. ``weight_version`` is the version of the last weights loaded (0: the initial ones).

    Every backend has every member below, so callers never probe: ``device`` is where its outputs' tensors may be
    moved for scoring; ``shared`` says whether it generates with a model trained in this process, reading its
    weights in place (then `load_weights` is refused: the trainer updates that model); ``sleeps`` says whether
    `sleep` frees memory (vLLM with ``enable_sleep_mode``; elsewhere `sleep` and `wake_up` do nothing); after
    `close` it cannot generate. ``sampling`` is how `generate` samples; it may be replaced between calls (evaluation
    samples with its own settings, then puts the training ones back).
    """

    weight_version: int
    sampling: SamplingConfig
    device: torch.device
    shared: bool
    sleeps: bool

    def generate(self, prompts: Sequence[Sequence[int]], n: int,
                 info: Optional[Dict[str, list]] = None) -> Rollout:
        """Samples ``n`` responses per prompt (prompt token ids, no padding); returns N = len(prompts) * n rows."""
        ...

    def load_weights(self, version: int, tensors: Dict[str, torch.Tensor]) -> None:
        """Replaces the named weights (HF parameter names) and records ``version``."""
        ...

    def sleep(self) -> None:
        """Frees the engine's accelerator memory until `wake_up` (a no-op unless ``sleeps``)."""
        ...

    def wake_up(self) -> None:
        """Takes the memory `sleep` freed back (a no-op when awake)."""
        ...

    def close(self) -> None:
        """Releases the engine; the backend cannot generate afterwards."""
        ...
