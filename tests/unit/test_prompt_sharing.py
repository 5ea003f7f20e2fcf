"""`coati_relay.inference.prompt_sharing`: the samples of a group share one forward of their prompt, in training
(`response_logprobs(..., share_prompts=True)`, values and gradients) and in generation (`TransformersBackend`),
with the numbers of the full forward; and the consumer takes that path for a transformers policy under DDP, where
two gloo ranks step with the gradient of the full forward."""
from __future__ import annotations

from typing import List

import pytest
import torch
from gloo_ranks import run_ranks
from train_round_helpers import make_config, make_rollout, record_steps

from coati_relay.inference.prompt_sharing import prompt_runs, shared_prompt_logits
from coati_relay.roles.logprobs import response_logprobs

# Three groups of G=3 with left-padded prompts of 4, 2 and 1 real tokens; responses of 1..4 tokens.
PROMPTS = [[5, 9, 12, 7], [30, 4], [17]]
RESPONSES = [[3, 8, 1], [40], [6, 6, 6, 6], [2, 9], [11, 12, 13, 14], [7], [21, 22], [5, 5, 5], [8]]
G = 3


@pytest.fixture(scope="module")
def model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).train()


@pytest.fixture(scope="module")
def batch():
    rollout = make_rollout(PROMPTS, RESPONSES, G, [0.0] * len(RESPONSES))
    return rollout.sequences, rollout.attention_mask, rollout.response_mask.float(), rollout.response_ids.size(1)


def _value_and_grads(model, seq, attn, weights, num_resp, share: bool):
    model.zero_grad()
    logp = response_logprobs(model, seq, attn, num_resp, share_prompts=share)
    (logp * weights).sum().backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


def test_prompt_runs():
    prompts = torch.tensor([[0, 4], [0, 4], [3, 4], [3, 4], [3, 4], [0, 4]])
    mask = torch.tensor([[0, 1], [0, 1], [1, 1], [1, 1], [1, 1], [1, 1]])
    # The last row has the ids of the first but another mask: a run of its own.
    assert prompt_runs(prompts, mask).tolist() == [0, 0, 1, 1, 1, 2]
    assert prompt_runs(prompts[1:3], mask[1:3]) is None
    assert prompt_runs(prompts[:1], mask[:1]) is None


@pytest.mark.parametrize("rows", [slice(0, 9), slice(2, 8), slice(4, 6)], ids=["groups", "cut-groups", "one-pair"])
def test_shared_forward_gives_the_full_values_and_gradients(model, batch, rows):
    seq, attn, resp_mask, num_resp = (x[rows] if torch.is_tensor(x) else x for x in batch)
    weights = torch.randn(resp_mask.shape, generator=torch.Generator().manual_seed(1)) * resp_mask
    full, full_grads = _value_and_grads(model, seq, attn, weights, num_resp, share=False)
    shared, shared_grads = _value_and_grads(model, seq, attn, weights, num_resp, share=True)
    torch.testing.assert_close(shared * resp_mask, full * resp_mask, rtol=1e-5, atol=1e-5)
    for a, b in zip(shared_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_prompt_runs_once_per_run(model, batch):
    seq, attn, _, num_resp = batch
    shapes: List[tuple] = []
    hook = model.register_forward_hook(lambda m, args, kwargs, out: shapes.append(tuple(kwargs["input_ids"].shape)),
                                       with_kwargs=True)
    try:
        logits = shared_prompt_logits(model, seq, attn, num_resp)
    finally:
        hook.remove()
    prompt_width = seq.size(1) - num_resp
    assert shapes == [(len(PROMPTS), prompt_width - 1), (len(RESPONSES), num_resp + 1)]
    assert logits.shape[:2] == (len(RESPONSES), num_resp + 1)
    # No two adjacent rows share a prompt: nothing to share, the caller runs the full forward.
    assert shared_prompt_logits(model, seq[::G], attn[::G], num_resp) is None


def test_generation_with_a_shared_prefill_samples_what_repeated_prompts_do(tiny_model_path):
    from coati_relay.config.schema import SamplingConfig
    from coati_relay.inference.transformers_backend import TransformersBackend

    backend = TransformersBackend(tiny_model_path, SamplingConfig(max_new_tokens=6, temperature=1.0, seed=3),
                                  device="cpu")
    shared = backend.generate(PROMPTS, n=G)
    repeated = backend.generate([p for p in PROMPTS for _ in range(G)], n=1)
    assert torch.equal(shared.response_ids, repeated.response_ids)
    torch.testing.assert_close(shared.logprobs * shared.response_mask, repeated.logprobs * repeated.response_mask,
                               rtol=1e-5, atol=1e-5)


def test_consumer_shares_prompts_for_a_transformers_policy(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.toy import write_toy_dataset

    data = str(write_toy_dataset(tmp_path / "p.jsonl", num_prompts=16))
    cfg = make_config(tiny_model_path, data, train_batch_size=4, group_size=G, microbatch=4 * G, beta=0.0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    worker = ConsumerWorker.for_models(cfg, policy)
    assert worker.policy.causal_lm and worker.policy.shares_prompts
    shapes: List[tuple] = []
    policy.register_forward_hook(lambda m, args, kwargs, out: shapes.append(tuple(kwargs["input_ids"].shape)),
                                 with_kwargs=True)
    before = [p.detach().clone() for p in policy.parameters()]
    rollout = make_rollout(PROMPTS, RESPONSES, G, [1.0, 0.0, 0.5, 0.2, 0.9, 0.0, 1.0, 0.3, 0.0], policy=policy)
    shapes.clear()
    stats = worker.train_round(rollout)
    num_resp = rollout.response_ids.size(1)
    assert shapes == [(len(PROMPTS), rollout.prompt_ids.size(1) - 1), (len(RESPONSES), num_resp + 1)]
    assert stats["skipped_steps"] == 0
    after = list(policy.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


# -- two gloo ranks under torch DDP --------------------------------------------------------------------------------
WORLD = 2
TIMEOUT_S = 300
# A fourth group, so that each rank holds two: rank 0 the first two groups, rank 1 the last two.
RANK_PROMPTS = [PROMPTS[:2], [PROMPTS[2], [8, 19, 3]]]
RANK_RESPONSES = [RESPONSES[:6], RESPONSES[6:] + [[4, 4], [9, 1, 2], [13]]]
RANK_REWARDS = [[1.0, 0.0, 0.5, 0.2, 0.9, 0.0], [1.0, 0.3, 0.0, 0.7, 0.1, 0.4]]


def _traced_train_round(worker, batch) -> dict:
    """Trains ``batch`` on ``worker``; returns the step's gradients and the input shapes of each policy forward."""
    shapes: List[tuple] = []
    hook = worker.policy.unwrapped().register_forward_hook(
        lambda m, args, kwargs, out: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    grads = record_steps(worker)
    try:
        worker.train_round(batch)
    finally:
        hook.remove()
    return {"grads": grads, "shapes": shapes, "shares": worker.policy.shares_prompts}


def _rank_main(rank: int, port: int, cfg, model_path: str, batches, out_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.training.distributed import init_process_group

    torch.set_num_threads(1)
    init_process_group(rank, WORLD, "127.0.0.1", port, backend="gloo", timeout_s=120)
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    worker = ConsumerWorker.for_models(cfg, policy, rank=rank)
    torch.save(_traced_train_round(worker, batches[rank]), f"{out_dir}/rank{rank}.pt")


def _spawn(cfg, model_path: str, batches, out_dir) -> list:
    run_ranks(_rank_main, (cfg, model_path, batches, str(out_dir)), WORLD, TIMEOUT_S)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.slow
def test_two_ddp_ranks_sharing_prompts_get_the_gradient_of_the_full_forward(tiny_model_path, tmp_path):
    """Two gloo ranks under torch DDP, each with two groups, forward with shared prompts (one prompt forward per
    group); the gradient each rank steps with equals that of one rank running the full forward on all four groups."""
    from transformers import AutoModelForCausalLM

    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.rollout import Rollout
    from coati_relay.toy import write_toy_dataset

    data = str(write_toy_dataset(tmp_path / "p.jsonl", num_prompts=16))
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    batches = [make_rollout(p, r, G, w, policy=policy) for p, r, w in zip(RANK_PROMPTS, RANK_RESPONSES, RANK_REWARDS)]
    ranked = make_config(tiny_model_path, data, consumers=WORLD, train_batch_size=2, group_size=G,
                         microbatch=2 * G, beta=0.0)
    ranks = _spawn(ranked, tiny_model_path, batches, tmp_path)
    for batch, got in zip(batches, ranks):
        assert got["shares"], "DDP with a transformers policy shares prompts"
        assert got["shapes"] == [(batch.num_prompts, batch.prompt_ids.size(1) - 1),
                                 (batch.num_sequences, batch.response_ids.size(1) + 1)], "one forward per prompt"

    whole = Rollout.concat(batches, pad_token_id=0)
    single = make_config(tiny_model_path, data, train_batch_size=4, group_size=G, microbatch=4 * G, beta=0.0)
    worker = ConsumerWorker.for_models(single, AutoModelForCausalLM.from_pretrained(tiny_model_path,
                                                                                    dtype=torch.float32))
    worker.policy.shares_prompts = False
    expected = _traced_train_round(worker, whole)
    assert expected["shapes"] == [tuple(whole.sequences.shape)], "the full forward, every row with its prompt"
    want = expected["grads"][0]
    assert max(g.abs().max() for g in want.values()) > 1e-3, "a gradient of zero would prove nothing"
    for r, got in enumerate(ranks):
        assert len(got["grads"]) == 1 and got["grads"][0].keys() == want.keys()
        for name, grad in want.items():
            torch.testing.assert_close(got["grads"][0][name], grad, rtol=1e-4, atol=1e-6,
                                       msg=lambda m, r=r, name=name: f"rank {r}, {name}: {m}")
