"""A stand-in for ColossalChat's ``coati`` package at HEAD: the same module tree and exported names, with bodies
of our own (each class, function and object has a ``source`` attribute naming the module that defines it), so that
the finder's coexistence can be tested without ColossalChat's dependencies.

``write(root, broken=(), needs={})`` writes the package under ``root``; a module named in ``broken`` raises ImportError
on import, as a ColossalChat module does when one of its dependencies (wandb, datasets, ...) is missing; a module
``needs`` maps to a package first imports that package (``{"coati.models.lora": "loralib"}``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Optional

# module -> names it defines
DEFINED: Dict[str, List[str]] = {
    "coati.dataset.conversation": ["Conversation", "setup_conversation_template"],
    "coati.dataset.loader": ["load_tokenized_dataset", "DataCollatorForSupervisedDataset",
                             "DataCollatorForPromptDataset", "DataCollatorForPreferenceDataset",
                             "DataCollatorForKTODataset", "StatefulDistributedSampler", "RawConversationDataset"],
    "coati.dataset.tokenization_utils": ["tokenize_sft", "tokenize_prompt", "tokenize_rlhf", "tokenize_kto"],
    "coati.dataset.utils": ["is_rank_0", "jload", "pad_to_max_len"],
    "coati.distributed.comm": ["ray_broadcast_object", "ray_broadcast_tensor_dict", "SharedVariableActor"],
    "coati.distributed.consumer": ["BaseConsumer", "SimpleConsumer"],
    "coati.distributed.grpo_consumer": ["GRPOConsumer"],
    "coati.distributed.inference_backend": ["BaseInferenceBackend", "TransformersInferenceBackend",
                                            "VLLMInferenceBackend"],
    "coati.distributed.launch": ["launch_distributed"],
    "coati.distributed.loss": ["PolicyLoss"],
    "coati.distributed.producer": ["BaseProducer", "SimpleProducer"],
    "coati.distributed.utils": ["unbind_batch", "bind_batch", "masked_mean", "masked_sum"],
    "coati.distributed.reward.verifiable_reward": ["VerifiableReward"],
    "coati.distributed.reward.reward_fn": ["math_reward_fn", "boxed_math_reward_fn", "code_reward_fn"],
    "coati.experience_buffer.base": ["ExperienceBuffer"],
    "coati.experience_buffer.naive": ["NaiveExperienceBuffer"],
    "coati.experience_buffer.utils": ["BufferItem", "split_experience_batch", "make_experience_batch"],
    "coati.experience_maker.base": ["Experience", "ExperienceMaker"],
    "coati.experience_maker.naive": ["is_rank_0", "NaiveExperienceMaker"],
    "coati.models.base": ["BaseModel"],
    "coati.models.critic": ["Critic"],
    "coati.models.generation": ["update_model_kwargs_fn", "prepare_inputs_fn", "generate", "generate_streaming"],
    "coati.models.lora": ["LoraManager", "LoraConfig", "LoraBase", "LoraLinear", "LoraEmbedding",
                          "convert_to_lora_module", "lora_manager"],
    "coati.models.loss": ["GPTLMLoss", "PolicyLoss", "ValueLoss", "DpoLoss", "LogSigLoss", "LogExpLoss",
                          "OddsRatioLoss", "KTOLoss"],
    "coati.models.reward_model": ["RewardModel"],
    "coati.models.rlvr_reward_model": ["RLVRRewardModel"],
    "coati.models.utils": ["get_model_numel", "compute_reward", "calc_action_log_probs", "masked_mean",
                           "calc_masked_log_probs", "disable_dropout", "repad_to_left"],
    "coati.quant.llama_gptq.loader": ["load_quant"],
    "coati.quant.utils": ["low_resource_init"],
    "coati.ray.utils": ["get_actor_from_args", "get_receivers_per_sender"],
    "coati.trainer.base": ["SLTrainer", "OLTrainer"],
    "coati.trainer.callbacks.base": ["Callback"],
    "coati.trainer.callbacks.performance_evaluator": ["PerformanceEvaluator"],
    "coati.trainer.dpo": ["DPOTrainer"],
    "coati.trainer.grpo": ["GRPOTrainer"],
    "coati.trainer.kto": ["KTOTrainer"],
    "coati.trainer.orpo": ["ORPOTrainer"],
    "coati.trainer.ppo": ["PPOTrainer"],
    "coati.trainer.rm": ["RewardModelTrainer"],
    "coati.trainer.sft": ["SFTTrainer"],
    "coati.trainer.utils": ["AnnealingScheduler", "CycledDataLoader", "is_rank_0"],
    "coati.utils.accumulative_meter": ["AccumulativeMeanMeter"],
    "coati.utils.ckpt_io": ["load_checkpoint", "save_checkpoint"],
}

# package -> {name: submodule it is re-exported from}
EXPORTED: Dict[str, Dict[str, str]] = {
    "coati": {},
    "coati.dataset": {"Conversation": "conversation", "setup_conversation_template": "conversation",
                      "load_tokenized_dataset": "loader", "DataCollatorForPromptDataset": "loader",
                      "StatefulDistributedSampler": "loader", "tokenize_sft": "tokenization_utils",
                      "tokenize_prompt": "tokenization_utils"},
    "coati.distributed": {},
    "coati.distributed.reward": {},
    "coati.experience_buffer": {"ExperienceBuffer": "base", "NaiveExperienceBuffer": "naive"},
    "coati.experience_maker": {"Experience": "base", "ExperienceMaker": "base", "NaiveExperienceMaker": "naive"},
    "coati.models": {"BaseModel": "base", "Critic": "critic", "generate": "generation",
                     "generate_streaming": "generation", "prepare_inputs_fn": "generation",
                     "update_model_kwargs_fn": "generation", "LoraConfig": "lora",
                     "convert_to_lora_module": "lora", "lora_manager": "lora", "DpoLoss": "loss",
                     "KTOLoss": "loss", "LogExpLoss": "loss", "LogSigLoss": "loss", "PolicyLoss": "loss",
                     "ValueLoss": "loss", "RewardModel": "reward_model", "RLVRRewardModel": "rlvr_reward_model",
                     "disable_dropout": "utils"},
    "coati.quant": {"llama_load_quant": "llama_gptq", "low_resource_init": "utils"},
    "coati.quant.llama_gptq": {"load_quant": "loader"},
    "coati.ray": {},
    "coati.trainer": {"SLTrainer": "base", "OLTrainer": "base", "DPOTrainer": "dpo", "GRPOTrainer": "grpo",
                      "KTOTrainer": "kto", "ORPOTrainer": "orpo", "PPOTrainer": "ppo",
                      "RewardModelTrainer": "rm", "SFTTrainer": "sft"},
    "coati.trainer.callbacks": {"Callback": "base", "PerformanceEvaluator": "performance_evaluator"},
    "coati.utils": {"load_checkpoint": "ckpt_io", "save_checkpoint": "ckpt_io",
                    "AccumulativeMeanMeter": "accumulative_meter"},
}
ALIASES = {("coati.quant", "llama_load_quant"): "load_quant"}  # `from .llama_gptq import load_quant as ...`


def _body(module: str, names: Iterable[str]) -> str:
    lines = [f'"""Stand-in for ColossalChat {module}."""', f"SOURCE = {module!r}", ""]
    for name in names:
        if name[0].isupper():
            lines += [f"class {name}:", f"    source = {module!r}", ""]
        elif name == "lora_manager":
            lines += ["lora_manager = LoraManager()", ""]
        else:
            lines += [f"def {name}(*args, **kwargs):", f"    return {module!r}", "", f"{name}.source = {module!r}", ""]
    return "\n".join(lines)


def _package_body(package: str, exports: Dict[str, str]) -> str:
    lines = [f'"""Stand-in for ColossalChat {package}."""']
    for name, sub in exports.items():
        real = ALIASES.get((package, name), name)
        lines.append(f"from .{sub} import {real}" + (f" as {name}" if real != name else ""))
    lines.append(f"__all__ = {sorted(exports)!r}")
    return "\n".join(lines) + "\n"


def exported_names() -> Dict[str, List[str]]:
    """Every module of the stand-in with the names a user imports from it."""
    names = {module: list(defined) for module, defined in DEFINED.items()}
    for package, exports in EXPORTED.items():
        names[package] = list(exports)
    return names


def write(root: Path, broken: Iterable[str] = (), needs: Optional[Dict[str, str]] = None) -> Path:
    """Writes the package under ``root`` and returns ``root`` (the directory to put on sys.path)."""
    broken, needs = set(broken), dict(needs or {})
    files: Dict[str, str] = {}
    for module, defined in DEFINED.items():
        files[module] = _body(module, defined)
    for package, exports in EXPORTED.items():
        files[package + ".__init__"] = _package_body(package, exports)
    for module, text in files.items():
        parts = module.split(".")
        if parts[-1] == "__init__":
            path = root.joinpath(*parts[:-1], "__init__.py")
        else:
            path = root.joinpath(*parts[:-1], parts[-1] + ".py")
        name = module.removesuffix(".__init__")
        if name == "coati.ray.utils":  # as at HEAD: it imports a module ColossalChat no longer has
            text = "from coati.trainer.strategies import DDPStrategy\n" + text
        if name in broken:
            text = f"raise ImportError('ColossalChat {name} needs a package this host lacks')\n" + text
        if name in needs:
            text = f"import {needs[name]}\n" + text
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in {m.rsplit(".", 1)[0] for m in DEFINED} - set(EXPORTED):  # namespace-free: every dir a package
        init = root.joinpath(*package.split("."), "__init__.py")
        if not init.exists():
            init.write_text(f'"""Stand-in for ColossalChat {package}."""\n')
    return root
