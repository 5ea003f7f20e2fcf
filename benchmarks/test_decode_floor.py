"""Generation against its floor: what one decode step costs on this machine, what each generator pays per token, and
where an engine step's time goes, phase by phase, as a multiple of what the hardware needs for the phase.

Work: the vs-TRL setting (`test_vs_trl.py`): 8 numbered toy prompts x 8 samples, 128 new tokens (EOS ignored, so
every row decodes every step), on the 3.5M Qwen2 (hidden 256, 6 layers) and, per token only, the 22M one (hidden
512, 10 layers). ``--benchmark-disable`` (the smoke run) runs each benchmark once on the tiny model with 8 new
tokens.

- ``floor``: one decode step on the training module: a batch-64, one-token forward over a key/value cache holding
  the prompt and half the response (the mean context of a response), without gradient.
- ``transformers-generate``: the same model's ``generate`` (sampling, its dynamic cache), per new token.
- ``backend``: `TransformersBackend.around` the same module (`coati_relay.inference.decode_loop` over its default
  step, `coati_relay.inference.fused_step.FusedStep`), per new token.
- ``backend-model-forward``: the same with ``fused_decode=False``: the loop over the model's own forward.
- ``backend-compiled``: the same with ``compiled_decode`` (`coati_relay.inference.captured_decode`), per new token;
  ``compile_s``: its first call's first step (the compilation, paid once per process and shape bucket, in the
  warm-up round and not in the timed ones), and ``compile_trace`` ... ``compile_guards``: its seconds by phase.
- ``vllm``: `VLLMBackend` on the same checkpoint, per new token.
The generators' per-token times are a whole call (prefill included) over the new tokens. vLLM and the compiled
backend are skipped in the smoke run, whose few seconds their start-up or compilation does not fit, and vLLM where
it is missing.

Each generator's test measures the floor again in the same process and records ``x_floor``, its per-token time over
the floor: a same-run ratio, which a busy host distorts less than the times themselves. ``load_average`` (1 minute)
is recorded beside every figure.

`test_step_phases` times the phases of one colocated GRPO step on the same module, decoding with the fused loop and
with the compiled step: prefill (timed inside the generate call), decode (the rest of that call), sampling, scoring
(toy reward on the decoded text), log-probs (the training forward), backward, optimizer (AdamW) and hand-off (the
rollout pickled and read back, what the object store does between roles). Floors: prefill, log-probs and backward
are matmul-bound (`flops.py`'s FLOPs at the ``torch.mm`` peak measured in the same run); decode is the measured
one-step floor times the steps; sampling, scoring, optimizer and hand-off have no matmul floor (memory- or
Python-bound) and are reported as times only.
"""
from __future__ import annotations

import importlib.util
import os
import pickle
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List
from unittest import mock

import pytest
import torch
from flops import forward_flops_per_token, matmul_peak_flops, model_shapes
from peer_grpo import GENERATIONS, PROMPTS_PER_STEP, numbered_prompt

from coati_relay.config.schema import SamplingConfig

MODELS = {"3.5M": dict(hidden_size=256, num_layers=6), "22M": dict(hidden_size=512, num_layers=10)}
SMOKE = dict(hidden_size=128, num_layers=2)
NEW_TOKENS, SMOKE_NEW_TOKENS = 128, 8
FLOOR_REPEATS = 9  # steps timed per floor measurement (3 in the smoke run)


@dataclass
class Work:
    """The model (loaded once, float32, CPU), its name in `MODELS`, its checkpoint, the prompts' token ids and the
    new tokens per row."""

    name: str
    path: str
    model: torch.nn.Module
    prompts: List[List[int]]
    new_tokens: int
    smoke: bool

    @property
    def rows(self) -> int:
        return len(self.prompts) * GENERATIONS

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(max_new_tokens=self.new_tokens, temperature=1.0, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(MODELS))
def work_setting(request) -> Work:
    """The model of the parameter (3.5M or 22M; the tiny one in the smoke run, whose 22M case is skipped)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati_relay.toy import build_tiny_model, toy_prompt_text

    smoke = bool(request.config.getoption("benchmark_disable"))
    if smoke and request.param != "3.5M":
        pytest.skip("the smoke run decodes one model, the tiny one")
    shape = SMOKE if smoke else MODELS[request.param]
    path = str(build_tiny_model(**shape))
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [tokenizer(tokenizer.apply_chat_template(
        [{"role": "user", "content": numbered_prompt(toy_prompt_text("a"), i)}], add_generation_prompt=True,
        tokenize=False))["input_ids"] for i in range(PROMPTS_PER_STEP)]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return Work(request.param, path, model, prompts, SMOKE_NEW_TOKENS if smoke else NEW_TOKENS, smoke)


def _median_s(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _batch(w: Work):
    """Left-padded prompts [B, P], their mask, and the rows [N] of their samples (prompt-major)."""
    from coati_relay.inference.rollout_building import pad_prompts

    ids, mask = pad_prompts(w.prompts, 0)
    return ids, mask, torch.arange(ids.size(0)).repeat_interleave(GENERATIONS)


def one_step_floor(w: Work) -> float:
    """Median seconds of a batch-N one-token forward with the KV cache (prompt + half the response cached)."""
    from transformers import DynamicCache

    ids, mask, rows = _batch(w)
    context = ids.size(1) + w.new_tokens // 2
    seq = torch.randint(3, w.model.config.vocab_size, (rows.numel(), context))
    full_mask = torch.ones(rows.numel(), context + 1, dtype=torch.long)
    positions = torch.full((rows.numel(), 1), context)
    w.model.eval()
    with torch.no_grad():
        cache = DynamicCache(config=w.model.config)
        w.model(input_ids=seq, use_cache=True, past_key_values=cache, logits_to_keep=1)
        feed = seq[:, -1:]

        def step() -> None:
            w.model(input_ids=feed, attention_mask=full_mask, position_ids=positions, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
            cache.crop(-1)  # back to the context

        step()
        return _median_s(step, 3 if w.smoke else FLOOR_REPEATS)


def _record(figures: Dict, per_token_s: float, floor_s: float) -> None:
    figures.update(per_token_s=per_token_s, floor_step_s=floor_s, x_floor=per_token_s / floor_s,
                   load_average=os.getloadavg()[0])


@pytest.mark.parametrize("side", ["floor", "transformers-generate", "backend", "backend-model-forward",
                                  "backend-compiled", "vllm"])
def test_decode_per_token(benchmark, figures, work_setting, side):
    benchmark.group = "decode-per-token"
    w = work_setting
    if side == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    if side in ("vllm", "backend-compiled") and w.smoke:
        pytest.skip(f"{side}'s start-up (tens of seconds) does not fit the smoke run")
    ids, mask, rows = _batch(w)
    tokens: List[int] = []
    if side == "floor":
        run = one_step_floor
        per_call_tokens = 1
        tokens.append(1)
    elif side == "transformers-generate":
        from transformers import GenerationConfig

        config = GenerationConfig(do_sample=True, max_new_tokens=w.new_tokens, min_new_tokens=w.new_tokens,
                                  temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0)

        def run(_: Work) -> None:
            w.model.eval()
            with torch.no_grad():
                out = w.model.generate(input_ids=ids[rows], attention_mask=mask[rows], generation_config=config)
            tokens.append(out.size(1) - ids.size(1))
        per_call_tokens = w.new_tokens
    else:
        if side.startswith("backend"):
            from coati_relay.inference import TransformersBackend

            backend = TransformersBackend.around(w.model, w.path, w.sampling,
                                                 fused_decode=side != "backend-model-forward",
                                                 compiled_decode=side == "backend-compiled")
        else:
            from coati_relay.inference import VLLMBackend

            backend = VLLMBackend(w.path, w.sampling, seed=0)

        def run(_: Work) -> None:
            r = backend.generate(w.prompts, GENERATIONS)
            tokens.append(int(r.response_lengths.max()))
        per_call_tokens = w.new_tokens
    result = benchmark.pedantic(run, args=(w,), rounds=1 if w.smoke else 5, iterations=1,
                                warmup_rounds=0 if w.smoke else 1)
    assert all(t == per_call_tokens for t in tokens), tokens  # every row decoded every step
    if side == "floor":  # one_step_floor returns the median step of its own repeats
        _record(figures, result, result)
    else:
        stats = getattr(benchmark, "stats", None)
        elapsed = stats.stats.median if stats is not None else _median_s(lambda: run(w), 1)
        _record(figures, elapsed / per_call_tokens, one_step_floor(w))
    if side == "backend-compiled":
        figures.update(compile_figures(backend.captured))
    if side == "vllm":
        backend.close()


def compile_figures(captured) -> Dict[str, float]:
    """``compile_s``: the captured path's compilations (its first steps), and ``compile_PHASE``: their seconds in each
    of `captured_decode.COMPILE_PHASES` (codegen and build are about 0 where inductor's on-disk cache held the code)."""
    from coati_relay.inference.captured_decode import COMPILE_PHASES

    out = {"compile_s": sum(captured.compile_s.values())}
    for phase in COMPILE_PHASES:
        out[f"compile_{phase}"] = sum(p[phase] for p in captured.compile_phases.values())
    return out


def _phase(name: str, fn: Callable[[], object], out: Dict[str, List[float]]) -> object:
    t0 = time.perf_counter()
    value = fn()
    out.setdefault(name, []).append(time.perf_counter() - t0)
    return value


@pytest.mark.parametrize("decode", ["fused", "compiled"])
def test_step_phases(benchmark, figures, work_setting, decode):
    """One colocated GRPO step on the module, phase by phase, with each phase's floor; ``decode``: the backend's
    default loop over the fused step, or the compiled step (``compiled_decode``, its compilation in the warm-up round
    and recorded as ``compile_s``)."""
    from transformers import AutoTokenizer

    from coati_relay.inference import TransformersBackend, transformers_backend
    from coati_relay.inference.decode_loop import TokenSampler
    from coati_relay.inference.prompt_sharing import prefill_shared
    from coati_relay.rewards.toy_rewards import letter_fraction
    from coati_relay.roles.logprobs import response_logprobs

    benchmark.group = "step-phases"
    w = work_setting
    if w.name != "3.5M":
        pytest.skip("the phases are of the vs-TRL model's step (3.5M)")
    if decode == "compiled" and w.smoke:
        pytest.skip("the compiled step's compilation (seconds) does not fit the smoke run")
    peak = matmul_peak_flops()
    shapes = model_shapes(w.path)
    tokenizer = AutoTokenizer.from_pretrained(w.path)
    backend = TransformersBackend.around(w.model, w.path, w.sampling, compiled_decode=decode == "compiled")
    optimizer = torch.optim.AdamW(w.model.parameters(), lr=1e-5, weight_decay=0.01)
    ids, mask, rows = _batch(w)
    vocab = w.model.config.vocab_size
    times: Dict[str, List[float]] = {}  # phase -> seconds of each round (the warm-up included)

    def timed_prefill(*args, **kwargs):
        return _phase("prefill", lambda: prefill_shared(*args, **kwargs), times)

    def step() -> None:
        with mock.patch.object(transformers_backend, "prefill_shared", timed_prefill):
            rollout = _phase("generate", lambda: backend.generate(w.prompts, GENERATIONS), times)
        sampler = TokenSampler(w.sampling, rows.numel(), vocab, torch.device("cpu"))
        logits = torch.randn(rows.numel(), vocab)
        _phase("sampling", lambda: [sampler(logits) for _ in range(w.new_tokens)], times)
        texts = _phase("scoring", lambda: [letter_fraction(t, "a") for t in tokenizer.batch_decode(
            rollout.response_ids, skip_special_tokens=True)], times)
        w.model.train()
        lp = _phase("logprobs", lambda: response_logprobs(w.model, rollout.sequences, rollout.attention_mask,
                                                          rollout.response_ids.size(1), share_prompts=True), times)
        loss = -(lp * rollout.response_mask).sum() / rollout.response_mask.sum() * (sum(texts) + 1.0)
        _phase("backward", loss.backward, times)
        _phase("optimizer", lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=True)), times)
        _phase("handoff", lambda: pickle.loads(pickle.dumps(rollout)), times)

    benchmark.pedantic(step, rounds=1 if w.smoke else 3, iterations=1, warmup_rounds=0 if w.smoke else 1)
    floor_step = one_step_floor(w)
    prompt_len, new = ids.size(1), w.new_tokens
    prefill_flops = len(w.prompts) * (prompt_len - 1) * forward_flops_per_token(shapes, prompt_len / 2)
    response_fwd = rows.numel() * (new + 1) * forward_flops_per_token(shapes, prompt_len + new / 2)
    train_fwd = prefill_flops + response_fwd
    floors = {"prefill": prefill_flops / peak, "decode": floor_step * new, "logprobs": train_fwd / peak,
              "backward": 2 * train_fwd / peak}
    # the timed rounds; decode: each generate call less the prefill timed inside it (so never below zero)
    median = {name: statistics.median(values[-3:]) for name, values in times.items()}
    median["decode"] = statistics.median(g - p for g, p in zip(times["generate"][-3:], times["prefill"][-3:]))
    for phase in ("prefill", "decode", "sampling", "scoring", "logprobs", "backward", "optimizer", "handoff"):
        figures[f"{phase}_s"] = median[phase]
        if phase in floors:
            figures[f"{phase}_floor_s"] = floors[phase]
            figures[f"{phase}_x_floor"] = median[phase] / floors[phase]
    figures.update(matmul_peak_gflop_per_s=peak / 1e9, floor_step_s=floor_step, load_average=os.getloadavg()[0],
                   model=os.path.basename(w.path), rows=rows.numel(), new_tokens=new, decode=decode)
    if backend.captured is not None:
        figures.update(compile_figures(backend.captured))
    assert all(v > 0 for k, v in figures.items() if k.endswith("_s")), figures
