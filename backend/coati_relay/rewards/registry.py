"""Reward functions by name, and the checks that turn any user callable into a `RewardFn`.

A reward function scores N responses at once::

    fn(responses: list[str], gt_answers: list, prompts: list[str]) -> Tensor [N] float32

``gt_answers[i]`` and ``prompts[i]`` belong to ``responses[i]`` (repeat them G times for G responses per prompt).
"""
from __future__ import annotations

import functools
import numbers
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Union, runtime_checkable

import torch


@runtime_checkable
class RewardFn(Protocol):
    def __call__(self, responses: List[str], gt_answers: List, prompts: List[str]) -> torch.Tensor:
        ...


_REWARDS: Dict[str, Callable] = {}


def register_reward(name: str) -> Callable[[Callable], Callable]:
    """Decorator: registers a reward function under ``name``; a taken name raises ValueError."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_reward needs a non-empty name, got {name!r}")

    def deco(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"register_reward({name!r}) needs a callable, got {type(fn).__name__}")
        if name in _REWARDS and _REWARDS[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered ({_REWARDS[name].__qualname__})")
        _REWARDS[name] = fn
        return fn

    return deco


def reward_names() -> List[str]:
    return sorted(_REWARDS)


def registered_reward(name: str) -> Callable:
    """The function registered under ``name`` as it was registered (`get_reward_fn` adds the checks)."""
    if name not in _REWARDS:
        raise ValueError(f"unknown reward {name!r}; registered: {reward_names()}")
    return _REWARDS[name]


def _as_reward_tensor(out, n: int, name: str) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        scores = out.detach().to("cpu", torch.float32)
    elif isinstance(out, (list, tuple)) and all(isinstance(x, numbers.Real) for x in out):
        scores = torch.tensor([float(x) for x in out], dtype=torch.float32)
    else:
        raise TypeError(f"reward function {name} returned {type(out).__name__}; it must return a Tensor [N] or a "
                        "list of N floats")
    if scores.dim() == 2 and scores.size(1) == 1:
        scores = scores.squeeze(1)
    if scores.shape != (n,):
        raise ValueError(f"reward function {name} returned shape {tuple(scores.shape)} for {n} responses; "
                         f"it must return one score per response, shape [{n}]")
    return scores


def _as_list(x: Optional[Sequence], n: int, what: str, fill) -> list:
    if x is None:
        return [fill] * n
    if isinstance(x, (str, bytes)) or not isinstance(x, Sequence):
        raise TypeError(f"{what} must be a list with one entry per response, got {type(x).__name__}")
    if len(x) != n:
        raise ValueError(f"{what} has {len(x)} entries for {n} responses; repeat per-prompt values once per "
                         "response")
    return list(x)


def _checked(fn: Callable, name: str) -> Callable:
    @functools.wraps(fn)
    def reward_fn(responses: Sequence[str], gt_answers: Optional[Sequence] = None,
                  prompts: Optional[Sequence[str]] = None) -> torch.Tensor:
        if isinstance(responses, str) or not isinstance(responses, Sequence):
            raise TypeError(f"responses must be a list of str, got {type(responses).__name__}")
        if not all(isinstance(r, str) for r in responses):
            raise TypeError("responses must be a list of str (decode token ids first)")
        n = len(responses)
        gts = _as_list(gt_answers, n, "gt_answers", None)
        ps = _as_list(prompts, n, "prompts", "")
        try:
            out = fn(list(responses), gts, ps)
        except Exception as exc:
            if hasattr(exc, "add_note"):  # Python >= 3.11: the traceback (and Ray's error) names the reward
                first = repr(responses[0][:80]) if responses else "none"
                exc.add_note(f"raised by reward function {name} on a batch of {n} responses (the first: {first})")
            raise
        scores = _as_reward_tensor(out, n, name)
        bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
        if bad:
            i = bad[0]
            raise ValueError(f"reward function {name} returned {scores[i].item()} for response {i} of {n} "
                             f"({responses[i][:80]!r}){f' and {len(bad) - 1} more' if len(bad) > 1 else ''}; "
                             f"rewards must be finite numbers")
        return scores

    return reward_fn


def get_reward_fn(name_or_callable: Union[str, Callable]) -> Callable:
    """A checked `RewardFn`: a registered name, or any callable with the `RewardFn` signature.

    The result validates its inputs (``gt_answers``/``prompts`` may be None) and turns the callable's return value
    (Tensor or list of floats) into a float32 CPU tensor of shape [N]; anything else raises TypeError/ValueError.
    A reward that raises, or returns inf/NaN, stops the run with an error naming the reward and the response (no
    sample is dropped silently).
    """
    if isinstance(name_or_callable, str):
        if name_or_callable not in _REWARDS:
            raise ValueError(f"unknown reward {name_or_callable!r}; registered: {reward_names()} "
                             "(or pass a callable fn(responses, gt_answers, prompts))")
        return _checked(_REWARDS[name_or_callable], repr(name_or_callable))
    if callable(name_or_callable):
        return _checked(name_or_callable, getattr(name_or_callable, "__qualname__", repr(name_or_callable)))
    raise TypeError(f"get_reward_fn needs a reward name or a callable, got {type(name_or_callable).__name__}")
