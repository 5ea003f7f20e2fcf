"""Toy models, hand-made rollouts and run configs for tests of `ConsumerWorker.train_round` (no Ray).

`BigramLM`: the logits at a position depend on the token there only, so padding and positions change nothing and
every expected gradient can be written down with a few tensor operations. `OffDevice`: a second device on a host
that has only a CPU (see its docstring).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from coati_relay.roles.logprobs import response_logprobs
from coati_relay.rollout import Rollout

VOCAB = 12
PAD = 0


class BigramLM(nn.Module):
    """logits[n, s] = table[input_ids[n, s]]: [N, S, VOCAB]. Accepts (and ignores) the masks a causal LM takes."""

    def __init__(self, seed: int = 0, vocab: int = VOCAB):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=gen))

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.table[input_ids]


class TokenCritic(nn.Module):
    """values[n, s] = value[input_ids[n, s]]: [N, S] (the `CriticModel` interface)."""

    def __init__(self, seed: int = 0, vocab: int = VOCAB):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.value = nn.Parameter(torch.randn(vocab, generator=gen))

    def forward(self, input_ids, attention_mask):
        return self.value[input_ids]


class OffDevice(torch.Tensor):
    """A tensor that stands for one on another device than the models' (the CPU, on a GPU host).

    An operation mixing an `OffDevice` tensor with a plain one (both with dimensions; parameters are plain) raises
    as CUDA does, so a model given an `OffDevice` input fails in its first layer, and so does a loss mixing its
    output with an unmoved tensor. ``.to(device)`` (what `coati_relay.cluster.devices.to_device` does) gives a plain
    tensor:
    "moved to the models' device". Scalars mix freely, as CPU scalars do with CUDA tensors.
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.to and _names_a_device(args[1:], kwargs):
                return func(*args, **kwargs).as_subclass(torch.Tensor)
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
            off = [type(t) is cls for t in tensors]
        if any(off) and not all(off):
            raise RuntimeError(f"Expected all tensors to be on the same device (simulated): {func.__name__} got "
                               f"{off.count(True)} tensor(s) off the models' device and {off.count(False)} on it")
        return super().__torch_function__(func, types, args, kwargs)


def _names_a_device(args, kwargs) -> bool:
    return kwargs.get("device") is not None or any(isinstance(a, (str, torch.device)) for a in args)


def off_device(rollout: Rollout) -> Rollout:
    """The rollout with every tensor `OffDevice`."""
    fields = {k: v.as_subclass(OffDevice) if isinstance(v, torch.Tensor) else v for k, v in vars(rollout).items()}
    return Rollout(**fields)


def make_rollout(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], group_size: int,
                 rewards: Sequence[float], policy: Optional[nn.Module] = None,
                 logprob_shift: float = 0.0) -> Rollout:
    """A prompt-major rollout: ``prompts`` [P] (each repeated G times), ``responses`` [P*G] of any lengths.

    Behaviour log-probs: those of ``policy`` at temperature 1 (plus ``logprob_shift`` times a fixed pattern, for
    rollouts made by other weights), or zeros without a policy.
    """
    n = len(responses)
    if n != len(prompts) * group_size or len(rewards) != n:
        raise ValueError("make_rollout: need P*G responses and rewards")
    width_p = max(len(p) for p in prompts)
    width_r = max(len(r) for r in responses)
    prompt_rows = [list(p) for p in prompts for _ in range(group_size)]
    prompt_ids = torch.tensor([[PAD] * (width_p - len(p)) + p for p in prompt_rows])
    prompt_mask = torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in prompt_rows])
    response_ids = torch.tensor([list(r) + [PAD] * (width_r - len(r)) for r in responses])
    lengths = torch.tensor([len(r) for r in responses])
    response_mask = torch.arange(width_r).expand(n, width_r) < lengths.unsqueeze(1)
    logprobs = torch.zeros(n, width_r)
    if policy is not None:
        seq = torch.cat([prompt_ids, response_ids], dim=1)
        attn = torch.cat([prompt_mask, response_mask.long()], dim=1)
        with torch.no_grad():
            logprobs = response_logprobs(policy, seq, attn, width_r)
        logprobs = logprobs + logprob_shift * torch.linspace(-1, 1, n * width_r).view(n, width_r)
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                   response_mask=response_mask, logprobs=logprobs * response_mask, response_lengths=lengths,
                   group_size=group_size, weight_version=0, rewards=torch.tensor(rewards, dtype=torch.float32))


# The grpo_config ColossalChat's rl_example.py passes for DAPO (its consumer has no DAPO defaults of its own), less
# the reward keys.
DAPO_KEYS = {"filter_range": [0.01, 0.99], "dynamic_batching": True, "clip_eps_low": 0.2, "clip_eps_high": 0.28,
             "beta": 0.0, "loss_variation": "token_level", "filter_truncated_response": True}


def make_config(model_path: str, data_path: str, core_algo: str = "GRPO", consumers: int = 1,
                train_batch_size: int = 2, microbatch: Optional[int] = None, group_size: int = 2,
                generate: Optional[Dict] = None, train_model: Optional[Dict] = None,
                plugin_config: Optional[Dict] = None, **grpo):
    """A checked `RunConfig` for one producer (8 prompts a round) and ``consumers`` consumers on the ddp plugin (or
    ``plugin_config``), with the toy reward; DAPO gets `DAPO_KEYS` (``grpo`` overrides them); ``train_model``: more
    train_model_config keys."""
    from coati_relay.assembly.build import build_run_config

    grpo_config = {"lr": 1e-2, "reward_fn_type": "toy_letter", **(DAPO_KEYS if core_algo == "DAPO" else {}), **grpo}
    if microbatch is not None:
        grpo_config["train_microbatch_size"] = microbatch
    return build_run_config(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=consumers, num_episodes=1,
        inference_batch_size=8, inference_microbatch_size=2, train_batch_size=train_batch_size,
        train_minibatch_size=train_batch_size,
        train_dataset_config={"path": data_path, "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": model_path},
        generate_config={"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, **(generate or {})},
        train_model_config={"path": model_path, **(train_model or {})}, grpo_config=grpo_config,
        plugin_config=plugin_config or {"plugin": "ddp"},
        inference_backend="transformers", num_generations=group_size, core_algo=core_algo, progress=False)


def record_steps(worker) -> List[Dict[str, torch.Tensor]]:
    """Makes ``worker.policy.step`` record the gradients it steps with; returns the (growing) list, one dict of
    parameter name -> gradient per optimizer step."""
    grads: List[Dict[str, torch.Tensor]] = []
    step = worker.policy.step

    def recording_step():
        grads.append({k: p.grad.detach().clone() for k, p in worker.policy.unwrapped().named_parameters()})
        return step()

    worker.policy.step = recording_step
    return grads
