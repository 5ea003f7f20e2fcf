"""Reference legacy PPO training step (``DetachedPPOTrainer.training_step``, legacy_spec §A.4) on plain modules.

The actor is a Hugging Face causal LM; the critic is a transformer body plus a value head valued as in the
reference version (``experience.critic_value``). Nothing here imports the shims or the engine.
"""
from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from coati_compat.reference.experience import Batch, action_log_probs, critic_value
from coati_compat.reference.losses import policy_loss, value_loss


def ppo_training_step(actor: nn.Module, critic_body: nn.Module, critic_head: nn.Module,
                      actor_optim: torch.optim.Optimizer, critic_optim: torch.optim.Optimizer, batch: Batch,
                      eps_clip: float = 0.2, value_clip: float = 0.4) -> Dict[str, float]:
    """One legacy step: actor loss, backward, step, zero_grad; then the same for the critic.

    batch: the experience dict (sequences [B,S], action_log_probs [B,A], values [B], reward [B], advantages [B,1],
    attention_mask [B,S], action_mask [B,A]). Returns ``{"actor_loss", "critic_loss"}``.
    """
    actor.train()
    critic_body.train()
    critic_head.train()
    sequences, attention_mask, action_mask = batch["sequences"], batch["attention_mask"], batch["action_mask"]
    num_actions = action_mask.size(1)

    log_probs = action_log_probs(actor, sequences, num_actions, attention_mask)
    actor_loss = policy_loss(log_probs, batch["action_log_probs"], batch["advantages"], action_mask, eps_clip)
    actor_loss.backward()
    actor_optim.step()
    actor_optim.zero_grad()

    values = critic_value(critic_body, critic_head, sequences, action_mask, attention_mask)
    critic_loss = value_loss(values, batch["values"], batch["reward"], action_mask, value_clip)
    critic_loss.backward()
    critic_optim.step()
    critic_optim.zero_grad()
    return {"actor_loss": actor_loss.item(), "critic_loss": critic_loss.item()}
