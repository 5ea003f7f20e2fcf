"""RL algorithms as pure, registered tensor functions (torch only): advantage estimators, losses, KL estimators.

A run dispatches by name: ``get("advantage", core_algo)`` is its estimator and ``spec(core_algo)`` what it needs;
``get("policy_loss", ...)``, ``get("value_loss", ...)`` and ``get("kl", ...)`` its losses and KL estimator, named in
``grpo_config`` (see `registry`). Kinds: ``advantage``, ``policy_loss``, ``value_loss``, ``kl``.
"""
from coati_relay.algorithms import estimators  # noqa: F401  (registers the advantage estimators)
from coati_relay.algorithms.advantages import gae, group_advantage, kl_folded_advantages
from coati_relay.algorithms.estimators import AdvantageInputs, Advantages
from coati_relay.algorithms.kl import kl_estimate, kl_k1, kl_k2, kl_k3, token_level_rewards
from coati_relay.algorithms.losses import policy_loss, value_loss
from coati_relay.algorithms.masked import masked_mean, masked_sum, masked_var, whiten, whiten_over_ranks
from coati_relay.algorithms.registry import (
    KINDS,
    AlgorithmSpec,
    get,
    names,
    register,
    register_estimator,
    spec,
    unregister,
)

__all__ = [
    "KINDS", "AdvantageInputs", "Advantages", "AlgorithmSpec", "gae", "get", "group_advantage", "kl_estimate",
    "kl_folded_advantages", "kl_k1", "kl_k2", "kl_k3", "masked_mean", "masked_sum", "masked_var", "names",
    "policy_loss", "register", "register_estimator", "spec", "token_level_rewards", "unregister", "value_loss",
    "whiten", "whiten_over_ranks",
]
