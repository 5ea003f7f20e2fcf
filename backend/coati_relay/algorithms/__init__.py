"""RL algorithms as pure, registered tensor functions (torch only): advantages, losses, KL estimators and shaping.

Look a function up by kind and name (``get("advantage", "grpo")``) or import it directly. Kinds: ``advantage``,
``policy_loss``, ``value_loss``, ``kl``.
"""
from coati_relay.algorithms.advantages import gae, group_advantage, kl_folded_advantages
from coati_relay.algorithms.kl import kl_estimate, kl_k1, kl_k2, kl_k3, token_level_rewards
from coati_relay.algorithms.losses import policy_loss, value_loss
from coati_relay.algorithms.masked import masked_mean, masked_sum, masked_var, whiten
from coati_relay.algorithms.registry import KINDS, get, names, register

__all__ = [
    "KINDS", "gae", "get", "group_advantage", "kl_estimate", "kl_folded_advantages", "kl_k1", "kl_k2", "kl_k3",
    "masked_mean", "masked_sum", "masked_var", "names",
    "policy_loss", "register", "token_level_rewards", "value_loss", "whiten",
]
