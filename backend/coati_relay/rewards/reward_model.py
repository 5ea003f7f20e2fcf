"""A learned reward model: a sequence-classification head (one label) read at the last real token."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import List, Optional, Union

import torch
from torch import nn

from coati_relay.cluster.devices import resolve_device, to_device, to_host

logger = logging.getLogger(__name__)


def _load_sequence_classifier(path: Union[str, os.PathLike]) -> nn.Module:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    if model.config.num_labels != 1:
        raise ValueError(f"reward model at {path} has num_labels={model.config.num_labels}; it needs exactly 1")
    return model


def _load_tokenizer(path: Path):
    if not ((path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class RewardModelScorer:
    """Scores token sequences with a reward model. ``__call__(sequences [N,S], attention_mask [N,S]) -> [N]``.

    ``model_or_path``: a checkpoint directory (loaded as ``AutoModelForSequenceClassification`` with one label, in
    float32) or an ``nn.Module``. The score is the model's output at each row's last position with
    ``attention_mask == 1``: for transformers classifiers with a ``score`` head the head is applied to the
    backbone's hidden states and read there; any other module must return per-token scores ([N,S] or [N,S,1],
    gathered there) or per-sequence scores ([N] or [N,1]), bare or as ``.logits``.

    ``device``: where the model runs (a producer passes its own device); None: the accelerator where the host has
    one, else the CPU. Inputs are moved there; scores come back on the CPU.
    """

    def __init__(self, model_or_path: Union[str, os.PathLike, nn.Module], tokenizer=None,
                 device: Optional[Union[str, torch.device]] = None):
        if isinstance(model_or_path, nn.Module):
            model = model_or_path
        elif isinstance(model_or_path, (str, os.PathLike)):
            path = Path(model_or_path)
            if not (path / "config.json").exists():
                raise ValueError(f"RewardModelScorer: {path} has no config.json; pass a transformers checkpoint "
                                 "directory or an nn.Module")
            model = _load_sequence_classifier(path)
            tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(path)
            logger.info("reward model loaded from %s (tokenizer: %s)", path, tokenizer is not None)
        else:
            raise TypeError(f"RewardModelScorer needs a checkpoint path or an nn.Module, got "
                            f"{type(model_or_path).__name__}")
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer

    @classmethod
    def from_causal_lm(cls, path: Union[str, os.PathLike], seed: int = 0,
                       device: Optional[Union[str, torch.device]] = None) -> "RewardModelScorer":
        """A reward model whose backbone is the causal LM at ``path`` and whose one-label head is random (seeded).

        For tests and demos: e.g. ``RewardModelScorer.from_causal_lm(coati_relay.toy.build_tiny_model())``.
        """
        target = resolve_device(device)
        with torch.random.fork_rng(devices=[target] if target.type == "cuda" else []):
            torch.manual_seed(seed)
            return cls(path, device=target)

    def _token_or_sequence_scores(self, sequences: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        head = getattr(self.model, "score", None)
        prefix = getattr(self.model, "base_model_prefix", "")
        backbone = getattr(self.model, prefix, None) if prefix else None
        if isinstance(head, nn.Module) and isinstance(backbone, nn.Module):
            hidden = backbone(input_ids=sequences, attention_mask=attention_mask).last_hidden_state  # [N,S,H]
            return head(hidden)
        out = self.model(input_ids=sequences, attention_mask=attention_mask)
        return getattr(out, "logits", out)

    @torch.no_grad()
    def __call__(self, sequences: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """sequences: LongTensor [N,S]; attention_mask: [N,S], 1 on real tokens. Returns float32 [N] on the CPU."""
        if sequences.dim() != 2 or attention_mask.shape != sequences.shape:
            raise ValueError(f"RewardModelScorer needs sequences and attention_mask of one shape [N,S]; got "
                             f"{tuple(sequences.shape)} and {tuple(attention_mask.shape)}")
        sequences, valid = to_device(self.device, sequences, attention_mask.bool())
        if not valid.any(dim=1).all():
            raise ValueError("RewardModelScorer: some rows have no token with attention_mask == 1")
        scores = self._token_or_sequence_scores(sequences, valid.long())
        if not isinstance(scores, torch.Tensor):
            raise TypeError(f"reward model returned {type(scores).__name__}; it must return a tensor or .logits")
        n, s = sequences.shape
        if scores.dim() == 3 and scores.size(-1) == 1:
            scores = scores.squeeze(-1)
        if scores.shape == (n, s):
            positions = torch.arange(s, device=self.device).expand(n, s)
            last = torch.where(valid, positions, -1).argmax(dim=1, keepdim=True)
            scores = scores.gather(1, last).squeeze(1)
        elif scores.shape == (n, 1):
            scores = scores.squeeze(1)
        if scores.shape != (n,):
            raise ValueError(f"reward model output has shape {tuple(scores.shape)}; expected per-token [N,S(,1)] or "
                             f"per-sequence [N(,1)] scores with N={n}, S={s} (a classifier needs num_labels=1)")
        return to_host(scores.float())

    def score_texts(self, texts: List[str], max_length: Optional[int] = None) -> torch.Tensor:
        """Tokenises ``texts`` (no special tokens added) and scores them. Returns float32 [N]."""
        if self.tokenizer is None:
            raise ValueError("RewardModelScorer.score_texts needs a tokenizer: pass tokenizer=... or build from a "
                             "checkpoint directory that holds one")
        batch = self.tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False,
                               truncation=max_length is not None, max_length=max_length)
        return self(batch["input_ids"], batch["attention_mask"])

    def as_reward_fn(self):
        """A `RewardFn` scoring ``prompt + response`` texts (ground truth unused)."""

        def reward_model_fn(responses: List[str], gt_answers: List, prompts: List[str]) -> torch.Tensor:
            return self.score_texts([p + r for p, r in zip(prompts, responses)])

        return reward_model_fn
