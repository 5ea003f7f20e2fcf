"""The transformers backend's decode loop (`coati_relay.inference.decode_loop`): the draws of transformers'
``generate`` under one seed, ``ignore_eos`` past an EOS, stopped rows leaving the batch, and the preallocated cache
written in place."""
from __future__ import annotations

from typing import List

import pytest
import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference import TransformersBackend
from coati_relay.inference.decode_loop import PreallocatedLayer
from coati_relay.inference.fused_step import FusedStep, ModelStep

PROMPTS = [[3, 40, 41, 42, 43, 44], [7, 8], [10, 20, 30, 40], [100, 101, 102]]


@pytest.fixture(scope="module")
def model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


def _generate_reference(model, sampling: SamplingConfig, n: int, seed: int) -> torch.Tensor:
    """transformers' own sampler on the same rows: [N, R] new tokens, EOS ignored."""
    from transformers import GenerationConfig

    from coati_relay.inference.rollout_building import pad_prompts

    ids, mask = pad_prompts(PROMPTS, 0)
    config = GenerationConfig(do_sample=True, max_new_tokens=sampling.max_new_tokens,
                              min_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                              top_k=max(sampling.top_k, 0), top_p=sampling.top_p, pad_token_id=0)
    defaults, model.generation_config = model.generation_config, GenerationConfig()  # no EOS from a backend's
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids.repeat_interleave(n, 0), attention_mask=mask.repeat_interleave(n, 0),
                                 generation_config=config)
    finally:
        model.generation_config = defaults
    return out[:, ids.size(1):]


@pytest.mark.parametrize("knobs", [dict(temperature=1.0), dict(temperature=0.7, top_k=20, top_p=0.9)])
def test_draws_equal_generate_under_one_seed(model, tiny_model_path, knobs):
    sampling = SamplingConfig(max_new_tokens=10, seed=5, ignore_eos=True, **knobs)
    backend = TransformersBackend.around(model, tiny_model_path, sampling)
    ours = backend.generate(PROMPTS, 3).response_ids
    assert torch.equal(ours, _generate_reference(model, sampling, 3, seed=5))


def test_ignore_eos_keeps_decoding_past_an_eos(model, tiny_model_path):
    """Greedy with EOS ignored: every token is the argmax of the full forward, also after an EOS was drawn."""
    eos = int(model.config.eos_token_id)
    head = model.lm_head.weight
    saved = head.detach().clone()
    with torch.no_grad():
        head[eos] = head.sum(dim=0) * 0.5  # EOS drawn often
    try:
        backend = TransformersBackend.around(model, tiny_model_path,
                                             SamplingConfig(max_new_tokens=8, temperature=0.0, ignore_eos=True))
        r = backend.generate(PROMPTS, 1)
        mask = r.attention_mask
        with torch.no_grad():
            logits = model(input_ids=r.sequences, attention_mask=mask,
                           position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits[:, -9:-1]
    finally:
        with torch.no_grad():
            head.copy_(saved)
    assert (r.response_ids == eos).any(), "the perturbed head should draw EOS"
    assert (r.response_lengths == 8).all()
    assert torch.equal(r.response_ids, logits.argmax(dim=-1))


class _Recording:
    """A decode step that records the rows [rows] of each call."""

    def __init__(self, step, rows: List[int]):
        self.step, self.rows = step, rows

    def refresh(self) -> None:
        self.step.refresh()

    def __call__(self, feed, *rest):
        self.rows.append(feed.size(0))
        return self.step(feed, *rest)


@pytest.mark.parametrize("fused", [True, False])
def test_stopped_rows_leave_the_batch(model, tiny_model_path, fused):
    """With most tokens stopping a row, later steps take fewer rows; the rollout still ends each row at its stop."""
    stops = list(range(2, 200))
    backend = TransformersBackend.around(model, tiny_model_path, SamplingConfig(max_new_tokens=12, seed=1,
                                                                                  stop_token_ids=stops),
                                         fused_decode=fused)
    prefill_rows: List[int] = []
    decode_rows: List[int] = []
    assert isinstance(backend.step, FusedStep if fused else ModelStep)
    backend.step = _Recording(backend.step, decode_rows)
    hook = model.register_forward_hook(lambda m, args, kwargs, out: prefill_rows.append(kwargs["input_ids"].size(0)),
                                       with_kwargs=True)
    try:
        r = backend.generate(PROMPTS, 8)
    finally:
        hook.remove()
    assert prefill_rows[0] == len(PROMPTS), "the prefill runs each prompt once"
    assert decode_rows[0] == 32 and decode_rows[-1] < 32 and decode_rows == sorted(decode_rows, reverse=True)
    short = r.response_lengths < 12
    assert short.any()
    last = r.response_ids[short, r.response_lengths[short] - 1]
    assert torch.isin(last, torch.tensor(stops)).all()


def test_preallocated_layer_writes_in_place_and_compacts():
    keys, values = torch.randn(3, 1, 4, 2), torch.randn(3, 1, 4, 2)
    layer = PreallocatedLayer.holding(keys, values, capacity=6)
    buffer = layer.keys.data_ptr()
    k, v = layer.update(torch.ones(3, 1, 1, 2), torch.zeros(3, 1, 1, 2))
    assert k.shape == (3, 1, 5, 2) and k.data_ptr() == buffer
    assert torch.equal(k[:, :, :4], keys) and torch.equal(v[:, :, 4], torch.zeros(3, 1, 2))
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(layer.keys[:, :, :4], keys[[2, 0]]) and layer.keys.data_ptr() == buffer
    layer.update(torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2))
    with pytest.raises(RuntimeError, match="capacity"):
        layer.update(torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2))
