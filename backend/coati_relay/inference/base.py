"""The `InferenceBackend` seam: turn prompt token ids into a `Rollout`, and load new weights between generations."""
from __future__ import annotations

from typing import Dict, Optional, Protocol, Sequence, runtime_checkable

import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.rollout import Rollout


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
