"""One training round of the engine (`Learner.train_round`), phase by phase, against this host's matmul peak:

    python benchmarks/train_phases.py [--microbatch N] [--rounds N] [--precision bf16|fp32] [--out RESULT.json]

The work of `peer_grpo.py`'s 128-token setting on the 3.5M model: 8 prompts of 29 tokens x 8 responses of up to 128
(lengths 100-128), GRPO, beta 0, the engine's settings (`peer_grpo.engine_kwargs`, in ``--precision``: bf16
autocast by default, as the pair trains), trained by a consumer around the
model (`ConsumerWorker.for_models`, no generation: the batch is random tokens, its behaviour log-probs the model's).
After a warm-up round, ``--rounds`` rounds are timed; per phase the fastest and the median round: the policy's
forwards (``forward``; ``log_softmax``, the vocabulary blocks, inside it), ``backward`` (``log_softmax_backward``
inside it), the optimizer step (``optimizer``; ``grad_norm`` and ``finite_check`` inside it), and the round
(``round``: the phases and what the learner does around them). Beside them the matmul floor of the forward and
the backward (`flops.py`: matmuls only, the prompt once per group, backward twice the forward) at the ``torch.mm``
peak in the precision's dtype measured in the same process, with torch's current thread count. Weight publishing
is not timed: a colocated run that generates with the transformers backend trains the weights in place and
publishes nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch
from flops import forward_flops_per_token, matmul_peak_flops, model_shapes
from peer_grpo import GENERATIONS, PROMPTS_PER_STEP, engine_kwargs

PROMPT_LEN, NEW_TOKENS = 29, 128
SHAPE = dict(hidden_size=256, num_layers=6)  # the 3.5M model of test_vs_trl.py


def _timed(times: Dict[str, float], name: str, fn: Callable) -> Callable:
    """``fn``, adding the seconds of each call to ``times[name]``."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[name] += time.perf_counter() - t0
    return timed


def _instrument(times: Dict[str, float]) -> None:
    """Wraps the functions of each phase in this process (module attributes, read at call time)."""
    import coati_relay.roles.learner as learner
    import coati_relay.roles.logprobs as logprobs
    import coati_relay.training.booster_backend as backend

    logprobs.chosen_logprobs = _timed(times, "log_softmax", logprobs.chosen_logprobs)
    logprobs._ChosenLogProbs.backward = staticmethod(_timed(times, "log_softmax_backward",
                                                            logprobs._ChosenLogProbs.backward))
    learner.response_logprobs = _timed(times, "forward", learner.response_logprobs)
    backend.TrainingBackend.backward = _timed(times, "backward", backend.TrainingBackend.backward)
    backend.check_weights = _timed(times, "finite_check", backend.check_weights)
    torch.nn.utils.get_total_norm = _timed(times, "grad_norm", torch.nn.utils.get_total_norm)
    backend.TrainingBackend.step = _timed(times, "optimizer", backend.TrainingBackend.step)


def _rollout(policy: torch.nn.Module):
    """The round's batch: [P*G, 29] prompts (each repeated G times) and [P*G, 128] right-padded responses of random
    tokens, behaviour log-probs of ``policy``, random rewards."""
    from coati_relay.roles.logprobs import response_logprobs
    from coati_relay.rollout import Rollout

    n, vocab = PROMPTS_PER_STEP * GENERATIONS, policy.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, vocab, (PROMPTS_PER_STEP, PROMPT_LEN), generator=gen).repeat_interleave(GENERATIONS, 0)
    lengths = torch.randint(100, NEW_TOKENS + 1, (n,), generator=gen)
    mask = torch.arange(NEW_TOKENS).expand(n, NEW_TOKENS) < lengths.unsqueeze(1)
    responses = torch.randint(2, vocab, (n, NEW_TOKENS), generator=gen) * mask
    with torch.no_grad():
        behaviour = response_logprobs(policy, torch.cat([prompts, responses], 1),
                                      torch.cat([torch.ones_like(prompts), mask.long()], 1), NEW_TOKENS) * mask
    return Rollout(prompt_ids=prompts, prompt_mask=torch.ones_like(prompts), response_ids=responses,
                   response_mask=mask, logprobs=behaviour, response_lengths=lengths, group_size=GENERATIONS,
                   weight_version=0, rewards=torch.rand(n, generator=gen))


def measure(microbatch: int, rounds: int, precision: str = "bf16") -> Dict[str, Any]:
    """The phases of ``rounds`` timed rounds (after one warm-up), their matmul floors and the peak."""
    from coati_relay.assembly.build import build_run_config
    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.toy import build_tiny_model
    from coati_relay.training.booster_backend import load_causal_lm

    model = str(build_tiny_model(**SHAPE))
    kwargs = engine_kwargs(model, 2, Path(tempfile.mkdtemp()), "transformers", True, NEW_TOKENS, None, microbatch,
                           precision=precision)
    del kwargs["colocate"]
    cfg = build_run_config(**kwargs, progress=False)
    torch.manual_seed(0)
    policy = load_causal_lm(model)
    learner = ConsumerWorker.for_models(cfg, policy).learner
    batch = _rollout(policy)
    times: Dict[str, float] = defaultdict(float)
    _instrument(times)
    learner.train_round = _timed(times, "round", learner.train_round)
    learner.train_round(batch)
    per_round: List[Dict[str, float]] = []
    for _ in range(rounds):
        times.clear()
        learner.train_round(batch)
        per_round.append(dict(times))
    s = model_shapes(model)
    forward = (PROMPTS_PER_STEP * PROMPT_LEN * forward_flops_per_token(s, (PROMPT_LEN + 1) / 2)
               + PROMPTS_PER_STEP * GENERATIONS * NEW_TOKENS
               * forward_flops_per_token(s, PROMPT_LEN + (NEW_TOKENS + 1) / 2))
    peak = matmul_peak_flops(dtype="bfloat16" if precision == "bf16" else "float32")
    return {"microbatch": microbatch, "precision": precision, "threads": torch.get_num_threads(),
            "matmul_peak_gflop_per_s": peak / 1e9,
            "floor_s": {"forward": forward / peak, "backward": 2 * forward / peak},
            "fastest_s": {k: min(r[k] for r in per_round) for k in per_round[0]},
            "median_s": {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}}


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--microbatch", type=int, default=PROMPTS_PER_STEP * GENERATIONS,
                   help="train_microbatch_size: sequences per forward and backward")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds, after one warm-up")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"], help="the ddp plugin's precision")
    p.add_argument("--out", help="also write the result here, as JSON")
    a = p.parse_args(argv)
    result = measure(a.microbatch, a.rounds, a.precision)
    print(json.dumps(result, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
