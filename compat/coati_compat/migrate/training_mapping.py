"""The model, generation, algorithm and plugin parts of the mapping (see `mapping`): the launch keywords
``inference_model_config``, ``train_model_config``, ``critic_model_config``, ``reward_model_config``,
``generate_config``, ``grpo_config``, ``plugin_config``, ``num_generations`` and ``core_algo``.
"""
from __future__ import annotations

import ast
from typing import Any, Dict, Optional, Tuple

from coati_compat.legacy.tables import LEGACY_LR, LEGACY_STRATEGIES, STRATEGY_DEFAULTS, class_plugin_config
from coati_compat.migrate.analyze import ActorCall, ModelRef
from coati_compat.migrate.builder import MappingContext
from coati_compat.migrate.expressions import args_refs, call_name, literal
from coati_relay.parts import from_legacy

LEGACY_KL_COEF = 0.1
# Strategy class -> the first legacy strategy name that built it with its defaults.
_STRATEGY_CLASSES = {entry.cls: name for name, entry in reversed(LEGACY_STRATEGIES.items())}


def _dict_code(items: Dict[str, str]) -> str:
    return "{" + ", ".join(f'"{k}": {v}' for k, v in items.items()) + "}"


def _path(b: MappingContext, ref: Optional[ModelRef]) -> Optional[str]:
    return None if ref is None or ref.path is None else b.code(ref.path)


def map_models(b: MappingContext, maker: Optional[ActorCall], trainer: Optional[ActorCall]) -> None:
    s, p = b.script, b.plan
    mm = s.maker_models.models if s.maker_models else {}
    tm = s.trainer_models.models if s.trainer_models else {}
    for fn, site in ((s.maker_models, maker), (s.trainer_models, trainer)):
        if site is not None and "model_fn" in site.kwargs and fn is None:
            b.note("unread", f"{site.class_name}'s model_fn is not a function of this script; its models were not "
                             f"read.", key="inference_model_config", line=site.line)
        elif fn is not None and fn.unread:
            b.note("unread", f"{site.class_name}'s model_fn: could not read which model it builds for "
                             f"{', '.join(fn.unread)}.", key="inference_model_config", line=site.line)
    inference = _path(b, mm.get("actor")) or _path(b, tm.get("actor"))
    if inference is None:
        inference = b.new_flag("model_path", 'required=True, help="local checkpoint of the policy (the actor)"')
        b.note("models", "no checkpoint path was found for the actor (the legacy default built a randomly "
                         "initialised model); the engine loads a local checkpoint: pass --model_path.",
               key="inference_model_config")
    train = _path(b, tm.get("actor")) or inference
    critic = _path(b, tm.get("critic")) or _path(b, mm.get("critic"))
    reward = _path(b, mm.get("reward_model"))
    if reward is None:
        reward = b.new_flag("reward_model_path", 'required=True, help="local checkpoint of the reward model"')
        b.note("models", "no checkpoint path was found for the reward model; pass --reward_model_path.",
               key="reward_model_config")
    p.kwargs["inference_model_config"] = _dict_code({"path": inference})
    _lora(b, tm.get("actor"), tm.get("critic"), train)
    if critic is not None:
        p.kwargs["critic_model_config"] = _dict_code({"path": critic})
    else:
        b.note("models", "no critic checkpoint was found: the engine's critic starts from the policy's trunk "
                         "with a fresh value head.", key="train_model_config")
    p.kwargs["reward_model_config"] = _dict_code({"path": reward})
    refs = list(mm.values()) + list(tm.values())
    families = sorted({b.code(r.family) for r in refs if r.family is not None})
    if families:
        b.note("models", f"model families ({', '.join(families)}) are no longer chosen: every model is a local "
                         f"Hugging Face checkpoint whose config.json sets the architecture. The reward model loads "
                         f"as a sequence classifier with one label, the critic as the checkpoint's trunk plus a "
                         f"value head.", key="inference_model_config")
    shaped = {}
    for ref in refs:
        if ref.from_config:
            shaped.setdefault(b.code(ref.path), set()).add(ref.role.replace("_", " "))
    for path, roles in sorted(shaped.items()):
        b.note("models", f"the legacy {', '.join(sorted(roles))} had random weights of the shape of {path}'s "
                         f"config (AutoConfig); the engine loads that checkpoint's weights.",
               key="inference_model_config")
    for dest in sorted({f for code in (inference, train, critic, reward) if code for f in args_refs(code)}):
        if dest in s.flags and s.flags[dest].default is None:
            b.note("models", f"--{dest} defaults to None, which legacy read as 'random weights of a default-size "
                             f"model'; the engine needs a local checkpoint directory: pass --{dest}.",
                   key="inference_model_config")
    if s.sets_pad_token:
        b.note("models", "the legacy script set tokenizer.pad_token at run time; the engine reads the tokenizer "
                         "saved with the model and needs a pad token there (save one with save_pretrained).",
               key="inference_model_config")
    initial = mm.get("initial_model")
    if initial is not None and _path(b, initial) not in (None, train):
        b.note("initial-model", f"the legacy initial model came from {_path(b, initial)}; the engine's reference "
                                f"model is the train_model_config checkpoint ({train}) as it was at the start.",
               key="train_model_config", line=initial.line)
    if s.maker_models is not None and s.maker_models.quantized:
        b.note("initial-model", "the GPTQ-quantized initial model (llama_load_quant) is not translated: the "
                                "reference model is loaded unquantized from train_model_config's path.",
               key="train_model_config")


def _lora(b: MappingContext, actor: Optional[ModelRef], critic: Optional[ModelRef], train: str) -> None:
    p = b.plan
    rank = b.code(actor.lora_rank) if actor is not None and actor.lora_rank is not None else None
    if rank is None or literal(ast.parse(rank, mode="eval").body) == (True, 0):
        p.kwargs["train_model_config"] = _dict_code({"path": train})
        return
    family = b.code(actor.family) if actor.family is not None else "None"
    p.prelude += [f"train_model_config = {_dict_code({'path': train})}",
                  f"lora = {b.helper('lora_config')}({rank}, {family})", "if lora:",
                  '    train_model_config["lora"] = lora']
    p.kwargs["train_model_config"] = "train_model_config"
    text = (f"lora_rank={rank} -> train_model_config['lora'] (peft): rank r, alpha=1 (the legacy scaling was "
            f"1/r), every linear layer the legacy LoRA replaced (see lora_config). Only the adapters train, and "
            f"only they are published to the producers.")
    if critic is not None and critic.lora_rank is not None:
        text += " The legacy critic had LoRA too; the engine's critic trains fully."
    b.note("lora", text, key="train_model_config")


TRUNCATED_SAMPLING_NOTE = ("top_k/top_p: the producers sample from the truncated distribution, as the legacy maker "
                           "did, and report its log-probs; the losses need those of the full distribution, which "
                           "the legacy maker computed with an actor forward. The consumers recompute them the same "
                           "way, one forward without gradient per round; drop top_k/top_p to save it.")


def map_generation(b: MappingContext, maker: Optional[ActorCall]) -> None:
    gen: Dict[str, str] = {}
    max_length = b.code(b.kw(maker, "max_length"))
    if max_length is not None:
        gen["max_new_tokens"] = f"{b.helper('max_new_tokens')}({max_length}, prompt_tokens)"
        b.note("generation", "max_length counted prompt and response together (prompts were padded to "
                             "prompt_tokens); max_new_tokens counts the response only, so it is max_length - "
                             "prompt_tokens.", key="generate_config")
    elif maker is not None:
        b.note("unread", "the maker's max_length was not found or not a plain value; the engine's default "
                         "max_new_tokens applies.", key="generate_config", line=maker.line)
    for key in ("temperature", "top_k", "top_p"):
        node = b.kw(maker, key)
        if node is None:
            continue
        code = b.code(node)
        if code is None:
            b.note("unread", f"the maker's {key} is not a plain value; left at the engine's default.",
                   key="generate_config", line=maker.line)
        else:
            gen[key] = code
    if "top_k" in gen or "top_p" in gen:
        b.note("generation", TRUNCATED_SAMPLING_NOTE, key="generate_config")
    b.plan.kwargs["generate_config"] = _dict_code(gen)


def map_algorithm(b: MappingContext, maker: Optional[ActorCall], trainer: Optional[ActorCall]) -> None:
    p, grpo = b.plan, {}
    lr = b.code(b.kw(trainer, "lr"))
    if lr is None:
        lr = b.new_flag("lr", f'type=float, default={LEGACY_LR!r}, help="learning rate of actor and critic"')
        who = ("DetachedPPOTrainer hard-coded" if trainer is None or trainer.class_name == "DetachedPPOTrainer"
               else f"{trainer.class_name} set up its own optimizer; DetachedPPOTrainer hard-coded")
        b.note("learning-rate", f"{who} lr={LEGACY_LR!r} for the actor and the critic; it is the default of --lr "
                                f"here (grpo_config lr and critic_lr).", key="grpo_config")
    grpo["lr"] = grpo["critic_lr"] = lr
    kl = b.code(b.kw(maker, "kl_coef"))
    if kl is None and b.kw(maker, "kl_coef") is not None:
        b.note("unread", "the maker's kl_coef is not a plain value; using the legacy default.", key="grpo_config")
    grpo["kl_coef"] = kl or repr(LEGACY_KL_COEF)
    b.note("kl-and-advantages", "kl_coef: the legacy maker subtracted kl_coef times a sequence-level KL estimate "
                                "from the reward and used advantage = reward - value; the engine's PPO puts "
                                "-kl_coef*KL on every response token and estimates advantages with GAE (gamma, "
                                "lam in grpo_config).", key="grpo_config")
    for legacy, new in (("eps_clip", ("clip_eps_low", "clip_eps_high")), ("value_clip", ("value_clip",))):
        code = b.code(b.kw(trainer, legacy))
        if code is not None:
            for key in new:
                grpo[key] = code
    fit = b.script.method_calls("fit")[0] if b.script.method_calls("fit") else None
    epochs = b.code(fit.kwargs.get("train_epochs")) if fit else None
    if epochs is not None and epochs != "1":
        grpo["ppo_epochs"] = epochs
        b.note("train-epochs", "train_epochs -> grpo_config['ppo_epochs']: legacy replayed an episode's "
                               "update_steps batches (shuffled) for train_epochs - 1 more epochs before pushing "
                               "the weights; the engine passes over a round's batches ppo_epochs times, in order, "
                               "before publishing a weight version.", key="grpo_config", line=fit.line)
    p.kwargs["grpo_config"] = _dict_code(grpo)
    p.kwargs["num_generations"] = "1"
    p.kwargs["core_algo"] = '"PPO"'


def _strategy_call(node: ast.AST) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``(class, keywords)`` of the one legacy strategy class that ``node`` builds with literal keywords only (no
    positional arguments); None otherwise."""
    calls = [n for n in ast.walk(node) if call_name(n) in STRATEGY_DEFAULTS]
    if len(calls) != 1 or calls[0].args:
        return None
    keywords = {k.arg: literal(k.value) for k in calls[0].keywords}
    if None in keywords or not all(ok for ok, _ in keywords.values()):
        return None
    return call_name(calls[0]), {k: value for k, (_, value) in keywords.items()}


def map_plugin(b: MappingContext, maker: Optional[ActorCall], trainer: Optional[ActorCall]) -> None:
    if b.kw(maker, "strategy_fn") is not None:
        b.note("maker-strategy", "the maker's strategy_fn has no counterpart: producers generate with the "
                                 "inference backend (--inference_backend) and need no training strategy.",
               key="inference_model_config", line=maker.line)
    node = b.kw(trainer, "strategy_fn")
    if node is None:
        b.plan.kwargs["plugin_config"] = '{"plugin": "ddp"}'
        return
    strategy = None
    if call_name(node) == "partial" and len(node.args) >= 2:
        strategy = b.code(node.args[1])
    built = _strategy_call(node) if strategy is None else None
    if built is not None:  # the strategy class with its own keywords: the settings the shim would pick
        try:
            b.plan.kwargs["plugin_config"] = repr(class_plugin_config(*built))
        except ValueError as exc:
            b.plan.kwargs["plugin_config"] = '{"plugin": "ddp"}'
            b.note("unread", f"the trainer's strategy_fn was not read ({exc}); using the 'ddp' plugin.",
                   key="plugin_config", line=trainer.line)
            return
        _note_strategy(b)
        return
    if strategy is None:
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & set(_STRATEGY_CLASSES)
        strategy = repr(_STRATEGY_CLASSES[sorted(names)[0]]) if len(names) == 1 else None
    ok, value = literal(ast.parse(strategy, mode="eval").body) if strategy else (False, None)
    if strategy is None or (ok and value not in from_legacy.LEGACY_STRATEGY_PLUGINS):
        b.plan.kwargs["plugin_config"] = '{"plugin": "ddp"}'
        b.note("unread", "the trainer's strategy_fn was not read; using the 'ddp' plugin.", key="plugin_config",
               line=trainer.line)
        return
    b.plan.kwargs["plugin_config"] = (repr(from_legacy.legacy_plugin_config(value)) if ok
                                      else f"{b.helper('legacy_plugin_config')}({strategy})")
    if not (ok and value == "ddp"):
        _note_strategy(b)


def _note_strategy(b: MappingContext) -> None:
    b.note("trainer-strategy", "strategies map to Booster plugins with the settings the legacy strategy picks (one "
                               "table, coati_compat.legacy.tables): naive and ddp -> 'ddp', colossalai_zero2 -> "
                               "'zero2', colossalai_gemini -> 'gemini'; the _cpu variants offload to CPU (cpu_offload, "
                               "offload_*_frac). ZeRO and Gemini keep the legacy fp16 and loss scale (the plugins "
                               "default to bf16); settings the plugin picks by itself are left out of the table. "
                               "Both need CUDA: on a CPU host add 'allow_cpu_fallback': True to "
                               "plugin_config to train with 'ddp'.", key="plugin_config")
