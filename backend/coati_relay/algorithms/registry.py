"""Name registry for the algorithm functions, and the dispatch of a run: the consumer looks its ``core_algo`` up here.

Kinds and the one signature each kind's functions have:

- ``advantage``: ``fn(inputs: AdvantageInputs, params: AlgorithmConfig) -> Advantages`` (see
  `coati_relay.algorithms.estimators`). The registered names are the accepted ``core_algo`` values (case-insensitive),
  and each entry carries its `AlgorithmSpec` (critic or not, group size, KL placement, default settings).
- ``policy_loss``: ``fn(logp, old_logp, advantages, mask, **options) -> (loss, stats)`` (the built-in:
  ``ppo_clip``, `coati_relay.algorithms.losses.policy_loss`, whose docstring gives the formula). logp: [B,T]
  log-probs of the policy being trained (with grad); old_logp: [B,T] behaviour log-probs; advantages: [B,1] or
  [B,T]; mask: [B,T] float, 1 on response tokens. ``options`` (keywords, always all given by the learner):
  ``clip_eps_low``, ``clip_eps_high``, ``aggregation`` (``loss_variation``), ``per_token_kl`` ([B,T] or None),
  ``beta`` (0 where the estimator keeps the KL out of the loss), ``loss_mask`` ([B], 1 for kept samples),
  ``total_tokens`` and ``num_samples`` (kept tokens and kept samples of the whole optimizer step: over every
  micro-batch and data-parallel rank: divide by them, not by this micro-batch's counts), ``stats_on_host``.
  Returns a scalar loss and a dict of stats: ``clip_frac`` (float or 0-dim tensor) is logged where present.
- ``value_loss``: ``fn(values, old_values, returns, clip_eps, mask, total_tokens) -> loss`` (the built-in:
  ``clipped``). values: [B,T] of the critic being trained (with grad); old_values: [B,T] at rollout time; returns:
  [B,T] targets; mask: [B,T]; clip_eps: ``value_clip``; total_tokens: valid tokens of the whole optimizer step (the
  masked sum divided by it is this micro-batch's share). Returns a scalar.
- ``kl``: ``fn(logp, ref_logp) -> per-token KL`` ([B,T] each; k1, k2, k3 built in).

A run names its functions in ``grpo_config``: ``core_algo`` the advantage estimator, ``policy_loss``,
``value_loss`` and ``kl_estimator`` the others (`coati_relay.config.algorithm`); the learner looks them up here
where it uses them (`coati_relay.roles.learner`). Adding one is one registered function (``@register("advantage",
"name", spec=...)``, ``@register("policy_loss", "name")``, ...) and its test; a user's travels to the actors by value
(`coati_relay.config.user_code`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, TypeVar

KINDS = ("advantage", "policy_loss", "value_loss", "kl")

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class AlgorithmSpec:
    """What an advantage estimator needs from the run around it.

    needs_critic: the consumer trains a critic and passes its values (PPO).
    min_group_size: the fewest responses per prompt (``num_generations``) its baseline is defined for.
    kl_weight_key: the algorithm setting that weighs the KL to the reference model (``beta``, or PPO's ``kl_coef``);
      the reference model is loaded only when that weight is > 0.
    kl_in_loss: the policy loss carries ``beta * KL``; False where the estimator puts the KL into rewards or
      advantages itself.
    defaults: the algorithm settings whose default differs for this estimator (PPO's, an extension; ColossalChat's
      estimators have none).
    """

    needs_critic: bool = False
    min_group_size: int = 1
    kl_weight_key: str = "beta"
    kl_in_loss: bool = True
    defaults: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Entry:
    fn: Callable
    spec: Optional[AlgorithmSpec]


_REGISTRY: Dict[str, Dict[str, _Entry]] = {kind: {} for kind in KINDS}


def _table(kind: str) -> Dict[str, _Entry]:
    if kind not in _REGISTRY:
        raise ValueError(f"unknown algorithm kind {kind!r}; use one of {list(KINDS)}")
    return _REGISTRY[kind]


def register(kind: str, name: str, spec: Optional[AlgorithmSpec] = None) -> Callable[[F], F]:
    """Decorator: registers ``fn`` under ``(kind, name)``. Names are case-insensitive; a taken name raises.
    Advantage estimators need a ``spec``; the other kinds take none. ``fn`` has its kind's signature (this module's
    docstring); a run uses it where its name is given (``core_algo``, ``grpo_config["policy_loss"]``, ...)."""
    table = _table(kind)
    key = name.lower()
    if (kind == "advantage") != (spec is not None):
        raise ValueError(f"register({kind!r}, {name!r}): " + ("an advantage estimator needs spec=AlgorithmSpec(...)"
                                                              if kind == "advantage" else "only advantage "
                                                              "estimators take a spec"))

    def deco(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"register({kind!r}, {name!r}) needs a callable, got {type(fn).__name__}")
        if key in table and table[key].fn is not fn:
            raise ValueError(f"{kind} {name!r} is already registered ({table[key].fn.__qualname__}); pick another name")
        table[key] = _Entry(fn, spec)
        return fn

    return deco


def register_estimator(name: str, spec: Optional[AlgorithmSpec] = None) -> Callable[[F], F]:
    """Decorator: an advantage estimator under ``name`` (``core_algo=NAME.upper()`` or ``grpo_config["algo"]`` runs
    it); `register` ``("advantage", name, spec)``, with ``AlgorithmSpec()`` (no critic, any group size, KL in the loss)
    when no spec is given. ``fn(inputs: AdvantageInputs, params) -> Advantages`` (this module's docstring)."""
    return register("advantage", name, spec if spec is not None else AlgorithmSpec())


def unregister(kind: str, name: str) -> None:
    """Removes ``(kind, name)`` (for tests that register a throwaway function)."""
    _table(kind).pop(name.lower(), None)


def _entry(kind: str, name: str) -> _Entry:
    table = _table(kind)
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a str, got {type(name).__name__}")
    try:
        return table[name.lower()]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; registered: {sorted(table)}") from None


def get(kind: str, name: str) -> Callable:
    """The function registered under ``(kind, name)``; an unknown name raises ValueError listing the known ones."""
    return _entry(kind, name).fn


def spec(name: str) -> AlgorithmSpec:
    """The `AlgorithmSpec` of advantage estimator ``name`` (a ``core_algo``)."""
    return _entry("advantage", name).spec


def names(kind: str) -> List[str]:
    """Sorted names registered under ``kind``."""
    return sorted(_table(kind))
