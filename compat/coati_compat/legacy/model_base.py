"""Legacy ``coati.models.base``: the ``Actor``, ``Critic`` and ``RewardModel`` wrappers and ``get_base_model``, in
the call forms of both legacy releases, with the semantics of the reference version (ColossalAI ``b5f056636``)
wherever the forms cannot be told apart (``COATI_RELAY_LEGACY_NAMES=final`` picks the final release's, see
``coati_compat.imports.legacy_switch``):

- ``Actor.forward(sequences, num_actions, attention_mask)`` returns the log-probs of the last ``num_actions``
  tokens (reference); ``Actor.forward(input_ids, attention_mask)`` (final: a tensor where ``num_actions`` was is
  the attention mask) and any call without ``num_actions`` return the Hugging Face output. ``Actor.model`` is the HF
  causal LM.
- ``Critic.forward(sequences, action_mask, attention_mask)`` returns one value per sequence, [B]: with
  ``use_action_mask`` (set by ``get_critic_from_args``) and an action mask, the mean of the value head over the
  *prompt* tokens (masked by ``attention_mask``); otherwise the mean over every position but the last. The final
  release's ``Critic.forward(sequences, attention_mask)`` is accepted (a mask of the sequences' shape in the
  action-mask slot is the attention mask); it read the value at the last non-pad token, which the switch gives.
- ``RewardModel.forward(sequences, attention_mask)``: the mean of the value head over every position but the
  last, [B]; with the switch, the value at the last non-pad token.
- ``get_base_model(model)``: the HF model of an ``Actor``; a ``Critic``/``RewardModel`` itself (reference), or its
  ``model`` with the switch.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import nn

from coati_compat.imports import legacy_switch
from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.lora import LoRAModule
from coati_compat.legacy.rl_functions import action_log_probs


def _check_sequences(sequences: Any, attention_mask: Optional[torch.Tensor]) -> None:
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2:
        raise ValueError(f"sequences must be a LongTensor [B,S], got "
                         f"{tuple(sequences.shape) if isinstance(sequences, torch.Tensor) else type(sequences)}")
    if attention_mask is not None and attention_mask.shape != sequences.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must match sequences "
                         f"{tuple(sequences.shape)}")


@deprecated_api("coati.models.Actor")
class Actor(LoRAModule):
    """Wraps a Hugging Face causal LM (``self.model``) as the policy."""

    def __init__(self, model: nn.Module, lora_rank: int = 0, lora_train_bias: str = "none") -> None:
        super().__init__(lora_rank=lora_rank, lora_train_bias=lora_train_bias)
        self.model = model
        self.convert_to_lora()

    def forward(self, sequences: Optional[torch.LongTensor] = None, num_actions: Any = None,
                attention_mask: Optional[torch.Tensor] = None, *, input_ids: Optional[torch.LongTensor] = None,
                **model_kwargs: Any) -> Any:
        """sequences (or ``input_ids=``), attention_mask: [B,S]. With num_actions (an int): log-probs
        [B,min(num_actions,S-1)] of the last num_actions tokens; without: the model's output (``logits`` [B,S,V]).
        A tensor in the ``num_actions`` slot is the final release's attention mask."""
        if input_ids is not None:
            if sequences is not None:
                raise TypeError("Actor.forward takes the token ids once: as sequences (positionally) or input_ids=")
            sequences = input_ids
        if isinstance(num_actions, torch.Tensor) and num_actions.dim() > 0:
            if attention_mask is not None:
                raise TypeError("Actor.forward got a tensor where num_actions goes and an attention_mask as well: "
                                "call actor(sequences, num_actions, attention_mask) or actor(input_ids, "
                                "attention_mask)")
            num_actions, attention_mask = None, num_actions
        _check_sequences(sequences, attention_mask)
        output = self.model(input_ids=sequences, attention_mask=attention_mask, **model_kwargs)
        if num_actions is None:
            return output
        return action_log_probs(output["logits"], sequences, num_actions)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, return_action_mask: bool = True, **kwargs: Any
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Samples with the legacy loop (``coati.models.generation.generate``).

        input_ids: [B,P] left-padded prompts. Returns ``(sequences [B,S], attention_mask [B,S] or None,
        action_mask [B,S-P] or None)``: the attention mask is ``sequences != pad_token_id`` (None without a pad
        id); the action mask is True up to and including the first EOS of the generated span.
        """
        from coati_compat.legacy.generation import generate

        sequences = generate(self.model, input_ids, **kwargs)
        return generated_masks(sequences, input_ids.size(1), kwargs.get("pad_token_id"), kwargs.get("eos_token_id"),
                               return_action_mask)

    def get_base_model(self) -> nn.Module:
        return self.model


def generated_masks(sequences: torch.Tensor, input_len: int, pad_token_id: Optional[int], eos_token_id: Optional[int],
                    return_action_mask: bool = True
                    ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(sequences [B,S], attention_mask [B,S] or None, action_mask [B,S-input_len] or None)`` as the legacy
    ``Actor.generate`` returns them: attention where ``sequences != pad_token_id`` (None without a pad id), actions up
    to and including the first EOS of the generated span."""
    from coati_compat.legacy.generation import action_mask_after_prompt

    attention_mask = None if pad_token_id is None else sequences.ne(pad_token_id).long()
    if not return_action_mask:
        return sequences, attention_mask, None
    return sequences, attention_mask, action_mask_after_prompt(sequences, input_len, eos_token_id)


def _value_head(hidden_size: int, std: Optional[float] = None) -> nn.Linear:
    head = nn.Linear(hidden_size, 1)
    if std is not None:
        nn.init.normal_(head.weight, mean=0.0, std=std)
        nn.init.zeros_(head.bias)
    return head


def _last_hidden_state(model: nn.Module, sequences: torch.Tensor,
                       attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """[B,S,H] from a transformer body that returns ``last_hidden_state``."""
    return model(input_ids=sequences, attention_mask=attention_mask)["last_hidden_state"]


@deprecated_api("coati.models.Critic")
class Critic(LoRAModule):
    """A transformer body (``self.model``, returning ``last_hidden_state``) with a scalar ``value_head``."""

    def __init__(self, model: nn.Module, value_head: nn.Module, lora_rank: int = 0, lora_train_bias: str = "none",
                 use_action_mask: bool = False) -> None:
        super().__init__(lora_rank=lora_rank, lora_train_bias=lora_train_bias)
        self.model = model
        self.value_head = value_head
        self.use_action_mask = use_action_mask
        self.convert_to_lora()

    def forward(self, sequences: torch.LongTensor, action_mask: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """sequences, attention_mask: [B,S]; action_mask: [B,A]. Returns values [B] (see the module docstring)."""
        if attention_mask is None and action_mask is not None and action_mask.shape == sequences.shape:
            action_mask, attention_mask = None, action_mask  # final release: critic(sequences, attention_mask)
        _check_sequences(sequences, attention_mask)
        values = self.value_head(_last_hidden_state(self.model, sequences, attention_mask)).squeeze(-1)  # [B,S]
        if legacy_switch.final_release():
            return last_token_values(values, attention_mask)
        if action_mask is not None and self.use_action_mask:
            num_actions = action_mask.size(1)
            if not 0 < num_actions < sequences.size(1):
                raise ValueError(f"action_mask covers {num_actions} tokens of sequences of length "
                                 f"{sequences.size(1)}; it must leave at least one prompt token")
            prompt_mask = (torch.ones_like(values) if attention_mask is None else attention_mask.to(values.dtype))
            prompt_mask = prompt_mask[:, :-num_actions]
            prompt_values = values[:, :-num_actions]
            return (prompt_values * prompt_mask).sum(dim=1) / (prompt_mask.sum(dim=1) + 1e-8)
        return values[:, :-1].mean(dim=1)


def last_token_values(values: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The final release's score: ``values`` [B,S] at the last position the attention mask [B,S] keeps (position 0
    for a row it keeps nothing of; the last position without a mask). Returns [B]."""
    if attention_mask is None:
        return values[:, -1]
    positions = torch.arange(values.size(1), device=values.device)
    last = (attention_mask.long() * positions).max(dim=1).values
    return values[torch.arange(values.size(0), device=values.device), last]


@deprecated_api("coati.models.RewardModel")
class RewardModel(LoRAModule):
    """A transformer body with a scalar ``value_head`` scoring whole sequences."""

    def __init__(self, model: nn.Module, value_head: Optional[nn.Module] = None, lora_rank: int = 0,
                 lora_train_bias: str = "none") -> None:
        super().__init__(lora_rank=lora_rank, lora_train_bias=lora_train_bias)
        self.model = model
        self.convert_to_lora()
        if value_head is None:
            hidden = getattr(model.config, "word_embed_proj_dim", None) or model.config.hidden_size
            value_head = _value_head(hidden)
        self.value_head = value_head

    def forward(self, sequences: torch.LongTensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """sequences, attention_mask: [B,S]. Returns rewards [B]."""
        _check_sequences(sequences, attention_mask)
        values = self.value_head(_last_hidden_state(self.model, sequences, attention_mask)).squeeze(-1)  # [B,S]
        if legacy_switch.final_release():
            return last_token_values(values, attention_mask)
        return values[:, :-1].mean(dim=1)


@deprecated_api("coati.models.base.get_base_model")
def get_base_model(model: nn.Module) -> nn.Module:
    """The model inside a legacy wrapper: an ``Actor``'s Hugging Face model; a ``Critic`` or ``RewardModel`` (and
    any other module) itself, as in the reference version. With ``COATI_RELAY_LEGACY_NAMES=final``, as in the final
    release: the ``model`` of an ``Actor``, ``Critic`` or ``RewardModel``, and a TypeError for anything else."""
    if isinstance(model, Actor):
        return model.model
    if legacy_switch.final_release():
        if not isinstance(model, (Critic, RewardModel)):
            raise TypeError(f"get_base_model expects an Actor, Critic or RewardModel, got {type(model).__name__}; "
                            "unwrap a strategy's wrapper first (strategy.unwrap_model)")
        return model.model
    return model
