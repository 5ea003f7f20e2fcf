"""Run configuration: ColossalChat's `launch_distributed` keywords, checked and turned into one `RunConfig`
(`coati_relay.config.schema`).

Everything is validated here, in the driver, before any actor starts. Errors name the parameter and the fix.
"""
from __future__ import annotations

import inspect
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from coati_relay import algorithms
from coati_relay.assembly.colocate import check_colocate
from coati_relay.assembly.evaluation import build_evaluation, build_rollout_log
from coati_relay.assembly.inference_config import follow_training_precision
from coati_relay.assembly.models import build_models
from coati_relay.assembly.sampling import build_sampling
from coati_relay.checkpoint import CHECKPOINTS_DIR
from coati_relay.config.algorithm import build_algorithm
from coati_relay.config.callbacks import check_callbacks, may_stop
from coati_relay.config.checks import is_int, is_number, is_positive
from coati_relay.config.import_paths import register_algorithm_paths, resolve_callbacks, resolve_reward
from coati_relay.config.keys import (
    IGNORED_LAUNCH_KEYS,
    IGNORED_SECTION_KEYS,
    SECTION_KEYS,
    check_section_keys,
    closest,
    warn_ignored,
)
from coati_relay.config.meaning import default_of
from coati_relay.config.report_to import check_report_to
from coati_relay.config.run_dir import check_given_run_dir, default_run_dir
from coati_relay.config.schema import (
    AlgorithmConfig,
    Batches,
    Checkpointing,
    Data,
    EvalSettings,
    Plugin,
    Roles,
    RolloutLogSettings,
    RunConfig,
)
from coati_relay.config.user_code import ByValue, UserCode, UserCodeError, comes_with_engine, module_name, user_entries
from coati_relay.config.user_frame import warn_at_user
from coati_relay.exchange.sync_registry import find_weight_sync, weight_sync_names
from coati_relay.inference.registry import backend_names, backend_spec, find_backend

log = logging.getLogger(__name__)

DEFAULT_PROMPT_TOKENS = 512


class ConfigError(ValueError):
    """A launch parameter is wrong; the message names it and says how to fix it."""


def _positive_int(errors: List[str], name: str, value: Any, fix: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(f"{name} must be a positive int, got {type(value).__name__} {value!r}. {fix}".strip())
        return 1
    if value <= 0:
        errors.append(f"{name} must be > 0, got {value}. {fix}".strip())
        return 1
    return value


def _dict(errors: List[str], name: str, value: Any) -> Dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.append(f"{name} must be a dict, got {type(value).__name__}")
        return {}
    return dict(value)


def count_prompts(errors: List[str], dataset: Any, tokenizer_path: str, max_prompt_tokens: int,
                  system_prompt: Optional[str], tokenizer_kwargs: Optional[Dict[str, Any]] = None) -> int:
    """Loads the dataset once in the driver to count it and catch format errors early."""
    if errors:
        return 0
    from transformers import AutoTokenizer

    from coati_relay.prompts import load_prompts

    try:
        ds = load_prompts(dataset, AutoTokenizer.from_pretrained(tokenizer_path, **(tokenizer_kwargs or {})),
                          max_prompt_tokens=max_prompt_tokens, system_prompt=system_prompt)
    except (ValueError, FileNotFoundError, KeyError, TypeError) as exc:
        errors.append(f"train_dataset_config: {exc}")
        return 0
    return len(ds)


def _reward(errors: List[str], grpo: Dict[str, Any], reward_model_config: Optional[Dict[str, Any]]):
    """The run's reward: ColossalChat's ``reward_fn_type`` (required there: 'think_answer_tags', 'boxed' or 'code';
    a registered reward name is this engine's extension), or the extensions ``reward_fn`` (a callable, a
    registered name or an import path ``module:function``, which wins) and ``reward_model_config``."""
    from coati_relay.rewards.verifiable import RULE_REWARDS, STRUCTURE_TAG_NAMES

    if reward_model_config:
        return grpo.get("reward_fn", grpo.get("reward_fn_type"))
    if "reward_fn" not in grpo and "reward_fn_type" not in grpo:
        errors.append(f"grpo_config needs 'reward_fn_type' (ColossalChat's producer reads it: one of "
                      f"{list(RULE_REWARDS)}), or one of this engine's extensions: grpo_config['reward_fn'] (a "
                      f"callable, a registered reward name, e.g. 'toy_letter', or an import path "
                      f"'module:function') or reward_model_config")
        return None
    key = "reward_fn" if "reward_fn" in grpo else "reward_fn_type"
    reward = resolve_reward(errors, key, grpo[key])
    if reward is None:
        return None
    if callable(reward) and (key == "reward_fn" or grpo[key] is not reward):
        return reward
    if not isinstance(reward, str):
        errors.append(f"grpo_config[{key!r}] must be "
                      f"{'a registered name, an import path or a callable' if key == 'reward_fn' else 'a str'}, got "
                      f"{type(reward).__name__}")
        return reward
    if reward == "code" and not grpo.get("code_verifier_api_url"):
        errors.append("grpo_config['reward_fn_type'] = 'code' posts each program to a code verifier service: set "
                      "grpo_config['code_verifier_api_url'] (e.g. 'http://localhost:8000/check_correctness')")
    tags = grpo.get("response_format_tags")
    if reward == "think_answer_tags" and isinstance(tags, dict) and not set(STRUCTURE_TAG_NAMES) <= set(tags):
        errors.append(f"grpo_config['response_format_tags'] for 'think_answer_tags' must name the tags "
                      f"{list(STRUCTURE_TAG_NAMES)}, got {sorted(tags)}")
    if reward in RULE_REWARDS:
        return reward
    from coati_relay.rewards import get_reward_fn

    try:
        get_reward_fn(reward)
    except ValueError as exc:
        errors.append(f"grpo_config[{key!r}]: {exc} (ColossalChat's reward_fn_type values: {list(RULE_REWARDS)})")
    return reward


def keyword_names() -> List[str]:
    """The launch keywords `build_run_config` takes, in its signature's order."""
    return [p for p in inspect.signature(build_run_config).parameters if p != "ignored"]


def _check_launch_keys(errors: List[str], extra: Dict[str, Any]) -> None:
    """ColossalChat keywords without effect here warn once each; any other unknown keyword is an error."""
    valid = keyword_names() + list(IGNORED_LAUNCH_KEYS)
    for key in sorted(extra):
        if key in IGNORED_LAUNCH_KEYS:
            warn_ignored("launch_distributed", key, IGNORED_LAUNCH_KEYS[key])
        else:
            errors.append(f"launch_distributed has no keyword {key!r}{closest(key, valid)}")


def _check_sections(errors: List[str], sections: Dict[str, Dict[str, Any]]) -> None:
    for name, given in sections.items():
        check_section_keys(errors, name, given, SECTION_KEYS[name], IGNORED_SECTION_KEYS.get(name, {}))


def _placement(errors: List[str], strategy: Any, timeout_s: Any, role_resources: Any) -> Dict[str, Any]:
    from coati_relay.cluster.placement import ROLES, STRATEGIES

    if strategy not in STRATEGIES:
        errors.append(f"placement_strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if not is_positive(timeout_s):
        errors.append(f"placement_timeout_s must be a number of seconds > 0, got {timeout_s!r}")
    resources = _dict(errors, "role_resources", role_resources)
    for role, wanted in resources.items():
        if role not in ROLES:
            errors.append(f"role_resources has no role {role!r}{closest(str(role), ROLES)}; roles: {list(ROLES)}")
        elif not isinstance(wanted, dict) or not all(
                isinstance(k, str) and k not in ("CPU", "GPU") and is_positive(v) for k, v in wanted.items()):
            errors.append(f"role_resources[{role!r}] must map custom resource names (not CPU/GPU, which the engine "
                          f"sets) to amounts > 0, got {wanted!r}")
    return {"placement_strategy": strategy, "placement_timeout_s": float(timeout_s) if is_number(timeout_s) else 30.0,
            "role_resources": {r: {k: float(v) for k, v in w.items()} for r, w in resources.items()
                               if isinstance(w, dict)}}


def _roles(errors: List[str], num_producers: Any, num_proc_per_producer: Any, num_consumer_procs: Any,
           inference_backend: Any, weight_sync: Any, on_producer_failure: Any, n_behind: Any, timeout_s: Any,
           collective_timeout_s: Any, placement: Dict[str, Any]) -> Roles:
    np_ = _positive_int(errors, "num_producers", num_producers)
    ppp = _positive_int(errors, "num_proc_per_producer", num_proc_per_producer)
    nc = _positive_int(errors, "num_consumer_procs", num_consumer_procs)
    if isinstance(n_behind, bool) or not isinstance(n_behind, int) or n_behind < 0:
        errors.append(f"n_behind must be an int >= 0 (0: on-policy lock-step), got {n_behind!r}")
        n_behind = 0
    if not is_number(timeout_s) or timeout_s <= 0:
        errors.append(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        timeout_s = 300.0
    if not is_number(collective_timeout_s) or collective_timeout_s <= 0:
        errors.append(f"collective_timeout_s must be a number of seconds > 0 (default 60), got "
                      f"{collective_timeout_s!r}")
        collective_timeout_s = 60.0
    if on_producer_failure not in ("fail", "continue"):
        errors.append(f"on_producer_failure must be 'fail' or 'continue', got {on_producer_failure!r}")
    sync = find_weight_sync(weight_sync)
    if sync is None:
        errors.append(f"weight_sync must be {' or '.join(map(repr, weight_sync_names()))}, got {weight_sync!r}")
    elif sync.producer_loss is not None and on_producer_failure == "continue":
        errors.append(f"weight_sync={weight_sync!r} {sync.producer_loss}, so a run cannot go on after one dies: use "
                      f"on_producer_failure='fail' or weight_sync='object_store'")
    backend = find_backend(inference_backend)
    if backend is None:
        errors.append(f"inference_backend must be one of {list(backend_names())}, got {inference_backend!r}")
    if ppp > 1:
        import torch

        if not torch.cuda.is_available():
            errors.append(f"num_proc_per_producer={ppp} asks for tensor-parallel producers, which need GPUs; "
                          f"use 1 on a host without CUDA")
        if backend is None or not backend.tensor_parallel:
            sharding = " or ".join(f"inference_backend={n!r}" for n in backend_names()
                                   if backend_spec(n).tensor_parallel)
            errors.append(f"num_proc_per_producer={ppp} shards each producer's engine over {ppp} GPUs, which only "
                          f"{sharding} does (tensor_parallel_size); use 1 with {inference_backend!r}")
    return Roles(num_producers=np_, num_proc_per_producer=ppp, num_consumers=nc, inference_backend=inference_backend,
                 weight_sync=weight_sync, on_producer_failure=on_producer_failure, n_behind=n_behind,
                 timeout_s=float(timeout_s), collective_timeout_s=float(collective_timeout_s), **placement)


def _batches(errors: List[str], roles: Roles, num_episodes: Any, inference_batch_size: Any,
             inference_microbatch_size: Any, train_batch_size: Any, train_minibatch_size: Any, num_generations: Any,
             grpo: Dict[str, Any]) -> Batches:
    """The sizes, checked to tile: producers' micro-batches, consumers' shares and optimizer batches."""
    np_, nc = roles.num_producers, roles.num_consumers
    ne = _positive_int(errors, "num_episodes", num_episodes)
    ibs = _positive_int(errors, "inference_batch_size", inference_batch_size)
    imbs = _positive_int(errors, "inference_microbatch_size", inference_microbatch_size)
    tbs = _positive_int(errors, "train_batch_size", train_batch_size)
    tmbs = _positive_int(errors, "train_minibatch_size", train_minibatch_size)
    ng = _positive_int(errors, "num_generations", num_generations)
    if ibs % imbs:
        errors.append(f"inference_batch_size ({ibs}) must be a multiple of inference_microbatch_size ({imbs})")
    if tmbs > tbs or tbs % tmbs:
        errors.append(f"train_batch_size ({tbs}) must be a multiple of train_minibatch_size ({tmbs}) and >= it")
    if (ibs * np_) % (tbs * nc):
        errors.append(f"inference_batch_size * num_producers ({ibs}*{np_}={ibs * np_} prompts per weight version) "
                      f"must be a multiple of train_batch_size * num_consumer_procs ({tbs}*{nc}={tbs * nc}), "
                      f"otherwise consumers would wait for prompts that never come")
    if (ibs * np_ // imbs) % nc:
        errors.append(f"the {ibs * np_ // imbs} inference micro-batches per weight version "
                      f"(inference_batch_size*num_producers/inference_microbatch_size) must split evenly over "
                      f"num_consumer_procs={nc}")
    if tbs % imbs and imbs % tbs:
        errors.append(f"train_batch_size ({tbs}) and inference_microbatch_size ({imbs}) must divide one another")
    tmicro = grpo.get("train_microbatch_size", tmbs * ng)
    if isinstance(tmicro, bool) or not isinstance(tmicro, int) or tmicro <= 0:
        errors.append(f"grpo_config['train_microbatch_size'] must be a positive int (samples per forward), "
                      f"got {tmicro!r}")
        tmicro = 1
    return Batches(num_episodes=ne, inference_batch_size=ibs, inference_microbatch_size=imbs, train_batch_size=tbs,
                   train_minibatch_size=tmbs, train_microbatch_size=tmicro, num_generations=ng)


def _plugin(errors: List[str], plc: Dict[str, Any], num_consumer_procs: int,
            differences: List[str]) -> Tuple[Plugin, Optional[float], int]:
    """The plugin section, ColossalChat's ``plugin_config["max_norm"]`` (gradient clipping) if given, and the number
    of data-parallel consumers. Without a ``'plugin'`` key, ``plugin_config`` means what it means to ColossalChat
    (`training.plugins.resolve_colossalchat`: HybridParallelPlugin, tp 1, pp 1, bf16, ZeRO 2, updated with the given
    options; what this host cannot run goes to ``differences``). ``'plugin'`` (an extension of this engine) names
    one of `training.plugins.PLUGINS` with its own options instead."""
    from coati_relay.training.plugins import resolve_colossalchat, resolve_plugin

    plc = dict(plc)
    name = plc.pop("plugin", None)
    allow_fallback = plc.pop("allow_cpu_fallback", False)
    if not isinstance(allow_fallback, bool):
        errors.append(f"plugin_config['allow_cpu_fallback'] must be a bool, got {allow_fallback!r}")
    max_norm = plc.pop("max_norm", None)
    if max_norm is not None and (not is_number(max_norm) or not 0 < max_norm < float("inf")):
        errors.append(f"plugin_config['max_norm'] must be None or a finite number > 0 (gradient clipping), "
                      f"got {max_norm!r}")
        max_norm = None
    data_parallel = num_consumer_procs
    try:
        if name is None:
            chosen = resolve_colossalchat(plc, num_consumer_procs)
            name, plc, data_parallel = chosen.name, chosen.options, chosen.data_parallel
            differences.extend(f"plugin_config: {d}" for d in chosen.differences)
        else:
            plc.pop("microbatch_size", None)  # ColossalChat passes it for pipeline parallelism only
            name, plc = resolve_plugin(name, plc, allow_cpu_fallback=allow_fallback)
    except ValueError as exc:
        errors.append(f"plugin_config: {exc}")
        name = name or "ddp"
    return Plugin(name=name, options=plc, allow_cpu_fallback=allow_fallback is True), max_norm, data_parallel


def _prompt_tokens(tdc: Dict[str, Any]) -> int:
    """train_dataset_config's max_length where it is a usable int (checked in `_data`), else its default."""
    value = tdc.get("max_length", DEFAULT_PROMPT_TOKENS)
    return value if is_int(value) and value > 0 else DEFAULT_PROMPT_TOKENS


def _data(errors: List[str], tdc: Dict[str, Any], tokenizer_path: str, prompts_per_version: int,
          tokenizer_kwargs: Optional[Dict[str, Any]] = None) -> Data:
    dataset = tdc.get("path", tdc.get("prompts"))
    if dataset is None:
        errors.append("train_dataset_config needs 'path' (a .jsonl in ColossalChat's format or a .csv with a "
                      "'prompt' column) or 'prompts' (a list of strings)")
    elif "path" in tdc and (not isinstance(dataset, (str, os.PathLike)) or not str(dataset).strip()):
        errors.append(f"train_dataset_config['path'] must be the path of a .jsonl or .csv file, got {dataset!r}")
        dataset = None
    elif "path" in tdc and "prompts" in tdc:
        errors.append("train_dataset_config has both 'path' and 'prompts'; give one of them")
    max_prompt_tokens = _positive_int(errors, "train_dataset_config['max_length']",
                                      tdc.get("max_length", DEFAULT_PROMPT_TOKENS))
    system_prompt = tdc.get("system_prompt")
    if system_prompt is not None and not isinstance(system_prompt, str):
        errors.append(f"train_dataset_config['system_prompt'] must be a string or None (ColossalChat's default "
                      f"prompt), got {type(system_prompt).__name__}")
        system_prompt = None
    num_prompts = count_prompts(errors, dataset, tokenizer_path, max_prompt_tokens, system_prompt, tokenizer_kwargs)
    if not errors and num_prompts < prompts_per_version:
        errors.append(f"the dataset has {num_prompts} prompts, fewer than one weight version needs "
                      f"(inference_batch_size*num_producers = {prompts_per_version}); lower the batch sizes or add "
                      f"prompts")
    elif not errors and num_prompts % prompts_per_version:
        used = num_prompts - num_prompts % prompts_per_version
        log.warning("the dataset has %d prompts and a round takes %d (inference_batch_size*num_producers): each "
                    "episode trains on %d of them and leaves %d out (which ones changes with each episode's shuffle); "
                    "add or drop prompts, or change the batch sizes, to use every one", num_prompts,
                    prompts_per_version, used, num_prompts - used)
    return Data(dataset=dataset, max_prompt_tokens=max_prompt_tokens, system_prompt=system_prompt,
                num_prompts=num_prompts)


def build_run_config(
    *, num_producers: int, num_proc_per_producer: int, num_consumer_procs: int, num_episodes: int,
    inference_batch_size: int, inference_microbatch_size: int, train_batch_size: int, train_minibatch_size: int,
    train_dataset_config: Dict[str, Any], generate_config: Dict[str, Any], grpo_config: Dict[str, Any],
    plugin_config: Dict[str, Any], inference_model_config: Optional[Dict[str, Any]] = None,
    train_model_config: Optional[Dict[str, Any]] = None, tokenizer_config: Optional[Dict[str, Any]] = None,
    inference_backend: str = default_of(Roles, "inference_backend"),
    num_generations: int = default_of(Batches, "num_generations"), core_algo: str = default_of(RunConfig, "core_algo"),
    project_name: Optional[str] = None, save_interval: int = default_of(Checkpointing, "save_interval"),
    save_dir: Optional[str] = "./model", n_behind: int = default_of(Roles, "n_behind"), master_addr: str = "localhost",
    master_port: int = default_of(RunConfig, "master_port"),
    enable_profiling: bool = default_of(RunConfig, "enable_profiling"),
    critic_model_config: Optional[Dict[str, Any]] = None, reward_model_config: Optional[Dict[str, Any]] = None,
    run_dir: Optional[str] = None, resume_from: Optional[str] = None,
    on_producer_failure: str = default_of(Roles, "on_producer_failure"),
    timeout_s: float = default_of(Roles, "timeout_s"),
    collective_timeout_s: float = default_of(Roles, "collective_timeout_s"), seed: int = default_of(RunConfig, "seed"),
    progress: bool = default_of(RunConfig, "progress"), weight_sync: str = default_of(Roles, "weight_sync"),
    placement_strategy: str = default_of(Roles, "placement_strategy"),
    placement_timeout_s: float = default_of(Roles, "placement_timeout_s"),
    role_resources: Optional[Dict[str, Dict[str, float]]] = None, colocate: bool = default_of(Roles, "colocate"),
    report_to: Optional[List[str]] = None, callbacks: Optional[List[Any]] = None,
    eval_dataset_config: Optional[Dict[str, Any]] = None, eval_interval: int = default_of(EvalSettings, "interval"),
    eval_save_dir: Optional[str] = None, eval_generation_config: Optional[Dict[str, Any]] = None,
    log_rollout_interval: Optional[int] = default_of(RolloutLogSettings, "interval"),
    rollout_save_dir: Optional[str] = None, export_dir: Any = True, **ignored: Any,
) -> RunConfig:
    """Checks every launch parameter and the constraints between them; raises one `ConfigError` listing all. What
    each keyword means is said by the schema field it sets (`coati_relay.config.schema`; ``help(launch_distributed)``).

    What this host runs differently from ColossalChat (no CUDA: bf16, ZeRO, flash attention; tp/pp > 1 anywhere)
    is named in one `HostDifferenceWarning`, issued here in the driver once per run."""
    import torch

    errors: List[str] = []
    differences: List[str] = []
    cuda = torch.cuda.is_available()
    _check_launch_keys(errors, ignored)
    trackers = _report_to(errors, report_to)
    hooks = check_callbacks(errors, resolve_callbacks(errors, callbacks))
    _positive_int(errors, "save_interval", save_interval)
    tdc = _dict(errors, "train_dataset_config", train_dataset_config)
    imc = _dict(errors, "inference_model_config", inference_model_config)
    tmc = _dict(errors, "train_model_config", train_model_config)
    gen = _dict(errors, "generate_config", generate_config)
    grpo = _dict(errors, "grpo_config", grpo_config)
    plc = _dict(errors, "plugin_config", plugin_config)
    tokc = _dict(errors, "tokenizer_config", tokenizer_config)
    rm_cfg = _dict(errors, "reward_model_config", reward_model_config)
    critic_cfg = _dict(errors, "critic_model_config", critic_model_config)
    _check_sections(errors, {"train_dataset_config": tdc, "train_model_config": tmc,
                             "critic_model_config": critic_cfg, "reward_model_config": rm_cfg})
    if "path" in tokc and not isinstance(tokc["path"], (str, os.PathLike)):
        errors.append(f"tokenizer_config['path'] must be a directory or Hub ID, got {tokc['path']!r}")
    _rendezvous(errors, master_addr, master_port)
    if not isinstance(enable_profiling, bool):
        errors.append(f"enable_profiling must be True or False, got {enable_profiling!r}")

    roles = _roles(errors, num_producers, num_proc_per_producer, num_consumer_procs, inference_backend, weight_sync,
                   on_producer_failure, n_behind, timeout_s, collective_timeout_s,
                   _placement(errors, placement_strategy, placement_timeout_s, role_resources))
    plugin, max_norm, data_parallel = _plugin(errors, plc, roles.num_consumers, differences)
    roles = replace(roles, num_consumers=data_parallel)
    batches = _batches(errors, roles, num_episodes, inference_batch_size, inference_microbatch_size,
                       train_batch_size, train_minibatch_size, num_generations, grpo)
    sampling = build_sampling(errors, gen, grpo, roles.inference_backend, core_algo, _prompt_tokens(tdc))
    register_algorithm_paths(errors, grpo)
    algo = build_algorithm(errors, core_algo, grpo, batches.num_generations)
    if algo is not None and algo.filter_truncated_response and \
            all(gen.get(k) is None for k in ("max_new_tokens", "max_tokens")):
        # ColossalChat's consumer compares each response's width with generate_config's max_new_tokens or
        # max_tokens: None there, and no response is filtered (rl_example.py's transformers settings)
        warn_ignored("grpo_config", "filter_truncated_response",
                     "generate_config gives no max_new_tokens (or max_tokens), so ColossalChat's consumer filters no "
                     "response and neither does this engine; give generate_config['max_new_tokens'] to filter")
        algo = replace(algo, filter_truncated_response=False)
    if colocate is True and not imc.get("path") and tmc.get("path"):  # one policy: its path once is enough
        imc["path"] = tmc["path"]
    models = build_models(errors, roles, imc, tmc, tokc, critic_cfg, rm_cfg, core_algo,
                          None if algo is None else algorithms.spec(core_algo).needs_critic, differences, cuda)
    reward = _reward(errors, grpo, rm_cfg)
    if models.lora and plugin is not None and plugin.name == "gemini":
        errors.append("train_model_config['lora'] with plugin 'gemini': the LoRA adapters are published from the "
                      "unwrapped model, whose parameters Gemini shards across ranks; use plugin 'zero2' or 'ddp' "
                      "for LoRA runs")
    roles = replace(roles, colocate=check_colocate(errors, colocate, roles, models, plugin))
    models = replace(models, inference_model_kwargs=follow_training_precision(
        roles.inference_backend, models.inference_model_kwargs, plugin.name, plugin.options, roles.colocate))
    if max_norm is not None and algo is not None and algo.max_grad_norm is None:
        algo = replace(algo, max_grad_norm=max_norm)
    name, checkpointing = _run_settings(errors, seed, progress, project_name, save_interval, run_dir, save_dir,
                                        resume_from, tmc.get("checkpoint_path"), imc.get("checkpoint_path"),
                                        export_dir)
    data = _data(errors, tdc, models.tokenizer_path, batches.inference_batch_size * roles.num_producers,
                 models.tokenizer_kwargs)
    evaluation = build_evaluation(errors, eval_dataset_config, eval_interval, eval_save_dir, eval_generation_config,
                                  gen, grpo, sampling, None if errors else models.tokenizer_path, reward,
                                  checkpointing.run_dir, checkpointing.resume_from is not None,
                                  roles.inference_backend, data.max_prompt_tokens, core_algo, _prompt_tokens(tdc))
    rollout_log = build_rollout_log(errors, log_rollout_interval, rollout_save_dir, checkpointing.run_dir, name)
    if not errors:
        reward, user_code = _ship(errors, reward, algo.algo, bool(rm_cfg), algo)
    if errors:
        raise ConfigError("invalid launch configuration:\n  - " + "\n  - ".join(errors))
    warn_host_differences(differences)
    return RunConfig(roles=roles, batches=batches, models=models, data=data, sampling=sampling, plugin=plugin,
                     checkpointing=checkpointing, core_algo=core_algo, algo=algo, reward=reward, project_name=name,
                     report_to=trackers, seed=seed, progress=progress, user_code=user_code, callbacks=hooks,
                     stop_gate=may_stop(hooks), evaluation=evaluation, rollout_log=rollout_log,
                     master_port=master_port, enable_profiling=enable_profiling)


class HostDifferenceWarning(RuntimeWarning):
    """This host runs part of a ColossalChat configuration differently (no CUDA, no model parallelism)."""


def warn_host_differences(differences: List[str]) -> None:
    """The one warning of a run that names each difference from ColossalChat's run and what runs instead."""
    if differences:
        warn_at_user("this run differs from ColossalChat's on this host:\n  - " + "\n  - ".join(differences),
                     HostDifferenceWarning)


def _rendezvous(errors: List[str], master_addr: Any, master_port: Any) -> None:
    """ColossalChat's ``master_port``: the port the consumers' process group meets on (rank 0's node);
    ``master_addr``: ColossalChat's launcher passes the IP of consumer rank 0's node instead (launch.py), and so does
    this engine, so only its type is checked."""
    if not isinstance(master_addr, str) or not master_addr:
        errors.append(f"master_addr must be a host name or IP address (str), got {master_addr!r}")
    if not is_int(master_port) or not 0 < master_port < 65536:
        errors.append(f"master_port must be an int in 1..65535 (the consumers' rendezvous port), got "
                      f"{master_port!r}")


def _report_to(errors: List[str], report_to: Any) -> Tuple[str, ...]:
    try:
        return check_report_to(report_to)
    except ValueError as exc:
        errors.append(str(exc))
        return ()


def _run_settings(errors: List[str], seed: Any, progress: Any, project_name: Any, save_interval: int, run_dir: Any,
                  save_dir: Any, resume_from: Any, checkpoint_path: Any,
                  inference_checkpoint_path: Any = None, export_dir: Any = None) -> Tuple[str, Checkpointing]:
    """The run's name and where it writes and resumes from.

    ``project_name``: the trackers' project as given (ColossalChat's W&B project); the default run directory is
    ``runs/NAME`` with spaces as ``_`` (``runs/NAME-2``, ... for a fresh run where that holds an earlier run; a
    given ``run_dir`` that does is an error: `coati_relay.config.run_dir`). ``save_dir``: ColossalChat's
    ``"./model"`` by default; where this engine's ``run_dir`` is given and ``save_dir`` is not, under ``run_dir``.
    ColossalChat's driver passes the same ``checkpoint_path`` in both model configs (None: start afresh); here each
    names the checkpoint to resume from, like ``resume_from``, and given ones must agree."""
    if not is_int(seed) or seed < 0:
        errors.append(f"seed must be an int >= 0, got {seed!r}")
    if not isinstance(progress, bool):
        errors.append(f"progress must be a bool, got {progress!r}")
    if project_name is not None and (not isinstance(project_name, str) or not project_name.strip()):
        errors.append(f"project_name must be None or a non-empty str, got {project_name!r}")
        project_name = None
    for key, value in (("run_dir", run_dir), ("save_dir", save_dir)):
        if value is not None and (not isinstance(value, (str, os.PathLike)) or not str(value)):
            errors.append(f"{key} must be None or a directory path, got {value!r}")
    given = {k: v for k, v in (("resume_from", resume_from), ("train_model_config['checkpoint_path']",
                                                                checkpoint_path),
                               ("inference_model_config['checkpoint_path']", inference_checkpoint_path))
             if v is not None}
    if len({str(v) for v in given.values()}) > 1:
        errors.append(f"{' and '.join(f'{k}={v!r}' for k, v in given.items())} disagree; give one checkpoint")
    for key, value in given.items():
        if not isinstance(value, (str, os.PathLike)) or not str(value) or not Path(value).exists():
            errors.append(f"{key}={value!r} does not exist; pass a checkpoint directory "
                          f"(run_dir/{CHECKPOINTS_DIR}/step-NNNNNN) or a run directory (run_dir, holding "
                          f"{CHECKPOINTS_DIR}/)")
        elif key.endswith("['checkpoint_path']"):
            from coati_relay.checkpoint import resolve_checkpoint

            try:
                resolve_checkpoint(value)
            except FileNotFoundError as exc:
                errors.append(f"{key}: {exc} (this engine's checkpoints: run_dir/{CHECKPOINTS_DIR}/step-NNNNNN; "
                              f"None starts afresh)")
    name = project_name or "coati-relay"
    resume = next(iter(given.values()), None)
    given_run_dir = isinstance(run_dir, (str, os.PathLike)) and bool(str(run_dir))
    if given_run_dir:
        rd = Path(run_dir)
        check_given_run_dir(errors, rd, fresh=resume is None)
    else:
        rd = default_run_dir(Path("runs") / name.replace(" ", "_"), fresh=resume is None)
    if save_dir == "./model" and given_run_dir:  # ColossalChat's default, with this engine's run_dir given
        save_dir = None
    sd = Path(save_dir) if isinstance(save_dir, (str, os.PathLike)) and str(save_dir) else rd
    return name, Checkpointing(save_interval=save_interval, run_dir=rd, save_dir=sd,
                               resume_from=None if resume is None else str(resume),
                               export_dir=_export_dir(errors, export_dir, rd))


def _export_dir(errors: List[str], export_dir: Any, run_dir: Path) -> Optional[Path]:
    """Where the run exports its final policy: True: ``run_dir/hf_model``; a path: there; False or None: nowhere.
    A directory there must be empty or an earlier export (which the new one replaces)."""
    if export_dir is True:
        out = run_dir / "hf_model"
    elif export_dir is None or export_dir is False:
        return None
    elif isinstance(export_dir, (str, os.PathLike)) and str(export_dir):
        out = Path(export_dir)
    else:
        errors.append(f"export_dir must be True (run_dir/hf_model), a directory path, or False/None (no export), "
                      f"got {export_dir!r}")
        return None
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        from coati_relay.export import EXPORT_FILE  # an earlier export holds it

        if out.is_dir() and (out / EXPORT_FILE).is_file():
            return out
        errors.append(f"export_dir={str(out)!r} exists and is neither empty nor an earlier export; pass a new "
                      f"directory or export_dir=False")
        return None
    return out


def _ship(errors: List[str], reward: Any, core_algo: str, reward_model: bool,
          algo: AlgorithmConfig) -> Tuple[Any, UserCode]:
    """The reward as the actors get it, and the user's registry entries the run needs in every actor
    (`coati_relay.config.user_code`): a user callable travels by value, and so do a reward, an estimator, losses and a
    KL
    estimator registered in the driver only."""
    try:
        if reward_model:
            return reward, UserCode(user_entries(None, core_algo, algo))
        if callable(reward) and not comes_with_engine(reward):
            reward = ByValue(reward, f"grpo_config['reward_fn'] ({module_name(reward)})")
        registered = None if reward == "code" else reward  # the code reward is no registry entry
        return reward, UserCode(user_entries(registered, core_algo, algo))
    except UserCodeError as exc:
        errors.append(str(exc))
        return reward, UserCode()
