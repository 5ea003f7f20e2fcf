"""Legacy ``coati.models``: the model wrappers and the gpt2/bloom/opt/llama classes (see ``model_base`` and
``model_families``)."""
from coati_compat.legacy.lora import LoraLinear, LoRAModule, convert_to_lora_module
from coati_compat.legacy.losses import LogExpLoss, LogSigLoss, PolicyLoss, PPOPtxActorLoss, ValueLoss
from coati_compat.legacy.model_base import Actor, Critic, RewardModel
from coati_compat.legacy.model_families import (
                                                BLOOMRM,
                                                GPTRM,
                                                OPTRM,
                                                BLOOMActor,
                                                BLOOMCritic,
                                                GPTActor,
                                                GPTCritic,
                                                LlamaActor,
                                                LlamaCritic,
                                                LlamaRM,
                                                OPTActor,
                                                OPTCritic,
)

__all__ = [
    "Actor", "Critic", "RewardModel", "LoRAModule", "LoraLinear", "convert_to_lora_module", "PolicyLoss",
    "ValueLoss", "PPOPtxActorLoss", "LogSigLoss", "LogExpLoss", "GPTActor", "GPTCritic", "GPTRM", "BLOOMActor",
    "BLOOMCritic", "BLOOMRM", "OPTActor", "OPTCritic", "OPTRM", "LlamaActor", "LlamaCritic", "LlamaRM",
]
