"""The checked settings of evaluation during training and of the rollout log (ColossalChat's ``eval_*`` and
``*rollout*`` keywords of ``launch_distributed``), built in the driver before any actor starts.

Steps: ColossalChat counts both intervals and names its files by the consumers' optimizer steps
(``consumer_global_step``); weight version ``v`` (after ``v`` rounds) is optimizer step
``v * optimizer_steps_per_round * ppo_epochs`` (`RunConfig.training_step`). The run's own step (metrics.jsonl,
callbacks) stays the weight version.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, List, Mapping, Optional

from coati_relay.config.checks import is_int, is_number
from coati_relay.config.schema import Data, EvalSettings, RolloutLogSettings, SamplingConfig
from coati_relay.inference.registry import backend_spec

EVAL_DATASET_KEYS = ("path", "prompts", "max_length", "system_prompt")
# rule rewards: every evaluation prompt needs a gt_answer (code: test_cases) to judge an answer by
GT_REWARDS = ("boxed", "think_answer_tags", "code")


def _directory_problem(value: Any, key: str) -> Optional[str]:
    """Why ``value`` cannot be a directory to write into, or None."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        return f"{key} must be a directory path (str), got {value!r}"
    path = Path(value)
    if path.exists() and not path.is_dir():
        return f"{key}={str(value)!r} is a file, not a directory; pass a directory path"
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"{key}={str(value)!r} cannot be created: {str(parent)!r} is not a writable directory"
    return None


def _task(errors: List[str], name: Any, tdc: Any, tokenizer: Any, reward: Any) -> Optional[Data]:
    from coati_relay.prompts import load_prompts

    where = f"eval_dataset_config[{name!r}]"
    if not isinstance(name, str) or not name.strip() or any(c in name for c in "/\\\0") or name in (".", ".."):
        errors.append(f"eval_dataset_config: task name {name!r} must be a non-empty str without '/' or '\\' (it "
                      f"names the files {{task}}_training_step_{{step}}.jsonl)")
        return None
    if not isinstance(tdc, Mapping):
        errors.append(f"{where} must be a dataset config like train_dataset_config ({{'path': 'task.jsonl', "
                      f"'max_length': 512}}), got {type(tdc).__name__} {tdc!r:.60}")
        return None
    unknown = sorted(set(tdc) - set(EVAL_DATASET_KEYS))
    if unknown:
        from coati_relay.config.keys import closest

        errors += [f"{where} has no key {k!r}{closest(str(k), EVAL_DATASET_KEYS)}; valid keys: "
                   f"{list(EVAL_DATASET_KEYS)}" for k in unknown]
        return None
    if ("path" in tdc) == ("prompts" in tdc):
        errors.append(f"{where} needs exactly one of 'path' (a .jsonl in ColossalChat's format or a .csv with a "
                      f"'prompt' column) and 'prompts' (a list)")
        return None
    dataset = tdc.get("path", tdc.get("prompts"))
    if "path" in tdc and (not isinstance(dataset, (str, os.PathLike)) or not str(dataset).strip()):
        errors.append(f"{where}['path'] must be the path of a .jsonl or .csv file, got {dataset!r}")
        return None
    max_len = tdc.get("max_length", 512)
    if not is_int(max_len) or max_len <= 0:
        errors.append(f"{where}['max_length'] must be an int > 0 (prompt tokens kept), got {max_len!r}")
        return None
    try:
        ds = load_prompts(str(dataset) if "path" in tdc else dataset, tokenizer, max_prompt_tokens=max_len,
                          system_prompt=tdc.get("system_prompt"))
    except (ValueError, FileNotFoundError, KeyError, TypeError, OSError) as exc:
        errors.append(f"{where}: {exc}")
        return None
    if len(ds) == 0:
        errors.append(f"{where}: the dataset {dataset!r:.80} holds no prompts")
        return None
    if isinstance(reward, str) and reward in GT_REWARDS:
        column = "test_cases" if reward == "code" else "gt_answer"
        missing = sum(gt is None for gt in ds.info.get(column, [None] * len(ds)))
        if missing:
            errors.append(f"{where}: {missing} of {len(ds)} prompts have no {column!r}, which the reward "
                          f"{reward!r} needs to judge an evaluation answer; add it to every line")
            return None
    return Data(dataset=str(dataset) if "path" in tdc else list(dataset), max_prompt_tokens=max_len,
                    system_prompt=tdc.get("system_prompt"), num_prompts=len(ds))


def _eval_sampling(errors: List[str], gen: Mapping[str, Any], overrides: Mapping[str, Any], grpo: Mapping[str, Any],
                   backend: str, core_algo: str, prompt_tokens: int) -> tuple:
    """generate_config with n=1, updated by ``overrides`` (ColossalChat: SamplingParams of the merged dict), checked
    as generate_config is for ``backend``; temperature 0 (greedy) is allowed here. Returns (sampling, n)."""
    from coati_relay.assembly.sampling import build_sampling

    n = overrides.get("n", 1)
    if not is_int(n) or n < 1:
        errors.append(f"eval_generation_config['n'] must be an int >= 1 (responses per evaluation prompt), got {n!r}")
        n = 1
    merged = {**gen, **{k: v for k, v in overrides.items() if k != "n"}}
    if "max_new_tokens" in overrides or "max_tokens" in overrides:  # the override wins over the other spelling
        merged = {k: v for k, v in merged.items() if k not in ("max_new_tokens", "max_tokens") or k in overrides}
    greedy = is_number(merged.get("temperature")) and merged["temperature"] == 0
    if greedy:
        merged["temperature"] = 1.0
    seed = merged.pop("seed", None)  # checked here: build_sampling would warn about it a second time
    found: List[str] = []
    sampling = build_sampling(found, merged, grpo, backend, core_algo, prompt_tokens)
    errors += [e.replace("generate_config", "eval_generation_config (over generate_config)") for e in found]
    if seed is not None and (not is_int(seed) or seed < 0):
        errors.append(f"eval_generation_config['seed'] must be None or an int >= 0, got {seed!r}")
        seed = None
    return replace(sampling, temperature=0.0 if greedy else sampling.temperature, seed=seed), n


def build_evaluation(errors: List[str], eval_dataset_config: Any, eval_interval: Any, eval_save_dir: Any,
                     eval_generation_config: Any, gen: Mapping[str, Any], grpo: Mapping[str, Any],
                     train_sampling: SamplingConfig, tokenizer_path: Optional[str], reward: Any, run_dir: Path,
                     resuming: bool, backend: str, train_max_prompt_tokens: int, core_algo: str = "GRPO",
                     prompt_tokens: int = 512) -> Optional[EvalSettings]:
    """The checked `EvalSettings`, or None when evaluation is off (no eval_dataset_config, or eval_interval <= 0,
    as in ColossalChat). Problems go to ``errors``."""
    if not is_int(eval_interval):
        errors.append(f"eval_interval must be an int (optimizer steps between evaluations; <= 0 turns evaluation "
                      f"off), got {eval_interval!r}")
        return None
    if eval_generation_config is not None and not isinstance(eval_generation_config, Mapping):
        errors.append(f"eval_generation_config must be a dict of generate_config keys, got "
                      f"{type(eval_generation_config).__name__}")
        return None
    if eval_dataset_config is None:
        return None
    if not isinstance(eval_dataset_config, Mapping) or not eval_dataset_config:
        errors.append(f"eval_dataset_config must be a non-empty dict of task name -> dataset config (like "
                      f"train_dataset_config), e.g. {{'math': {{'path': 'math_eval.jsonl'}}}}, got "
                      f"{eval_dataset_config!r:.80}")
        return None
    if eval_interval <= 0:
        return None
    save_dir = Path(eval_save_dir) if eval_save_dir is not None else run_dir / "eval"
    problem = _directory_problem(save_dir, "eval_save_dir")
    if problem:
        errors.append(problem)
    elif save_dir.exists() and any(save_dir.iterdir()) and not resuming:
        errors.append(f"eval_save_dir={str(save_dir)!r} already exists and is not empty (ColossalChat refuses it "
                      f"too: results of two runs would mix); delete it or pass another directory")
    if errors or tokenizer_path is None:  # generate_config's own problems are reported once, by its check
        return None
    sampling, n = _eval_sampling(errors, gen, eval_generation_config or {}, grpo, backend, core_algo, prompt_tokens)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    tasks = {name: _task(errors, name, tdc, tokenizer, reward) for name, tdc in eval_dataset_config.items()}
    if backend_spec(backend).run_sizing is not None:  # the engine's length is sized to training's
        for name, task in tasks.items():
            if task is not None and task.max_prompt_tokens > train_max_prompt_tokens:
                errors.append(f"eval_dataset_config[{name!r}]['max_length'] ({task.max_prompt_tokens}) exceeds "
                              f"train_dataset_config's ({train_max_prompt_tokens}), which sizes the vLLM engine's "
                              f"max_model_len; lower it or raise the training one")
        if sampling.max_new_tokens > train_sampling.max_new_tokens:
            errors.append(f"eval_generation_config's max_new_tokens ({sampling.max_new_tokens}) exceeds "
                          f"generate_config's ({train_sampling.max_new_tokens}), which sizes the vLLM engine's "
                          f"max_model_len; lower it")
    if errors:
        return None
    return EvalSettings(tasks=tasks, interval=eval_interval, save_dir=save_dir, sampling=sampling, num_generations=n)


def build_rollout_log(errors: List[str], log_rollout_interval: Any, rollout_save_dir: Any, run_dir: Path,
                      project_name: str) -> Optional[RolloutLogSettings]:
    """The checked `RolloutLogSettings` (None: ``log_rollout_interval=None`` turns the log off, an extension).
    The file is ``rollout_save_dir/{project}_run_{uuid}.jsonl``, as in ColossalChat."""
    if log_rollout_interval is None:
        return None
    if not is_int(log_rollout_interval):
        errors.append(f"log_rollout_interval must be an int (optimizer steps between logged rollouts; <= 0: every "
                      f"rollout) or None (no log), got {log_rollout_interval!r}")
        return None
    save_dir = Path(rollout_save_dir) if rollout_save_dir is not None else run_dir / "rollout"
    problem = _directory_problem(save_dir, "rollout_save_dir")
    if problem:
        errors.append(problem)
        return None
    path = save_dir / f"{project_name.replace(' ', '_')}_run_{uuid.uuid4()}.jsonl"
    return RolloutLogSettings(path=path, interval=log_rollout_interval)

