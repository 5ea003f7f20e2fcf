"""Special token ids of a backend started from a module with explicit ids (no checkpoint, no tokenizer)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference import TransformersBackend
from coati_relay.inference.rollout_building import special_token_ids


def test_explicit_ids_need_no_tokenizer_and_stop_only_there(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.0)
    free = TransformersBackend.around(model, None, sampling, eos_token_ids=[], pad_token_id=0)
    assert free.tokenizer is None and free.pad_token_id == 0 and free.eos_token_id is None
    tokens = free.generate([[5, 6, 7]], 1).response_ids[0]
    assert tokens.numel() == 8, "no EOS id: every row runs to max_new_tokens"
    stop = int(tokens[2])
    stopped = TransformersBackend.around(model, None, dataclasses.replace(sampling), eos_token_ids=[stop],
                                         pad_token_id=0)
    rollout = stopped.generate([[5, 6, 7]], 1)
    first = tokens.tolist().index(stop)
    assert rollout.response_lengths.tolist() == [first + 1] and int(rollout.response_ids[0, first]) == stop


@pytest.mark.parametrize("kwargs,error", [
    (dict(eos_token_ids=None), "needs eos_token_ids"),
    (dict(eos_token_ids=[-1]), "eos_token_ids must be token ids"),
    (dict(eos_token_ids=[True]), "eos_token_ids must be token ids"),
    (dict(eos_token_ids=[2], pad_token_id=-3), "pad_token_id must be a token id"),
    (dict(eos_token_ids=[]), "pass pad_token_id"),
])
def test_bad_explicit_ids_raise(kwargs, error):
    with pytest.raises(ValueError, match=error):
        special_token_ids(None, None, object(), **kwargs)
