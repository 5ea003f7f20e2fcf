"""What the captured decode path (`coati_relay.inference.captured_decode`) holds and compiles over a long life: the
width attended to is one symbolic size, so a decode across many widths compiles once a bucket instead of hitting
dynamo's recompile limit (8) and running uncompiled; at most `MAX_BUCKETS` buckets are kept, and `sleep()` frees them
with the fused step's concatenated projections; no step builds a tensor from a Python number (a blocking
host-to-device copy on CUDA). The step runs under torch.compile's ``eager`` backend: dynamo traces and counts entries
as under inductor, without the code generation."""
from __future__ import annotations

import logging

import torch

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference import captured_decode
from coati_relay.inference.captured_decode import MAX_BUCKETS, CapturedDecoder
from coati_relay.inference.transformers_backend import TransformersBackend
from coati_relay.toy import build_tiny_model


def _backend(max_new_tokens: int, exact_window: bool = True) -> TransformersBackend:
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, seed=2, ignore_eos=True)
    backend = TransformersBackend(str(build_tiny_model(hidden_size=64, num_layers=2)), sampling)
    backend.captured = CapturedDecoder(backend.step, backend="eager")
    backend.captured._exact_window = exact_window
    return backend


def test_a_decode_across_many_widths_and_buckets_stays_compiled(dynamo_warnings, monkeypatch):
    """Attending as on CUDA (the written columns rounded up; here to multiples of 8 instead of 64, so that 80 new
    tokens cross ten of them), and nine batch sizes making nine buckets: each width and each bucket was a dynamo
    entry of one function, so the ninth ran uncompiled."""
    monkeypatch.setattr(captured_decode, "CAPACITY_STEP", 8)
    torch._dynamo.reset()
    backend = _backend(80, exact_window=False)
    backend.generate([[5, 9, 14, 3]], 1)
    backend.sampling = SamplingConfig(max_new_tokens=2, temperature=1.0, seed=2, ignore_eos=True)
    for n in range(2, 10):
        backend.generate([[5, 9, 14, 3]], n)
    assert not [m for m in dynamo_warnings if "recompile_limit" in m], dynamo_warnings
    assert len(backend.captured._compiled) == 9  # one entry a bucket shape


def test_past_its_limit_the_decoder_says_it_decodes_uncompiled(monkeypatch, caplog):
    monkeypatch.setattr(captured_decode, "RECOMPILE_LIMIT", 2)
    backend = _backend(2)
    for n in (1, 2):
        backend.generate([[5, 9]], n)
    with caplog.at_level(logging.WARNING, logger=captured_decode.__name__):
        backend.generate([[5, 9]], 3)
    assert "decodes uncompiled" in caplog.text and len(backend.captured._compiled) == 2


def test_buckets_are_bounded_and_sleep_frees_them_with_the_fused_projections():
    backend = _backend(4)
    for n in (1, 2, 3):
        backend.generate([[5, 9, 14]], n)
    decoder = backend.captured
    assert len(decoder._buckets) == MAX_BUCKETS and list(decoder._buckets) == [(2, 64), (3, 64)]
    backend.generate([[5, 9]] * 2, 1)  # 2 rows, a narrower prompt: the kept (2, 64) bucket serves it
    assert list(decoder._buckets) == [(3, 64), (2, 64)]
    assert decoder.held_bytes() > 0 and backend.step._qkv
    before = backend.generate([[5, 9, 14]], 3)
    backend.sleep()
    assert decoder.held_bytes() == 0 and not backend.step._qkv and not backend.step._gate_up
    after = backend.generate([[5, 9, 14]], 3)  # the same seed: everything is made again, the same draws
    assert torch.equal(before.response_ids, after.response_ids) and torch.equal(before.logprobs, after.logprobs)


def test_no_step_builds_a_tensor_from_a_python_number(monkeypatch):
    """``torch.tensor`` from host values is a blocking copy on CUDA: a decode makes the same few whatever its
    length (the stop ids; the count is of every caller in the process), none per step."""
    made = []
    real = torch.tensor

    def counted(*args, **kwargs):
        made.append(args[0] if args else kwargs.get("data"))
        return real(*args, **kwargs)

    counts = {}
    for steps in (3, 9):
        backend = _backend(steps)
        backend.generate([[5, 9, 14]], 2)  # the bucket is made outside the count
        monkeypatch.setattr(captured_decode.torch, "tensor", counted)
        made.clear()
        backend.captured.decode(None, torch.tensor([14, 14]), torch.ones(2, 1, dtype=torch.long),
                                backend.sampling, [], backend.pad_token_id)
        monkeypatch.setattr(captured_decode.torch, "tensor", real)
        counts[steps] = len(made)
    assert counts[3] == counts[9], counts
