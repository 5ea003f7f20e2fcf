"""The algorithm section of a run (ColossalChat's ``grpo_config``): one table of key, default and check, typed.

``ALGORITHM_KEYS`` lists every setting `AlgorithmConfig` holds (each field says what it means), with ColossalChat's
defaults (4f9953be3,
``grpo_consumer.py``, ``consumer.py``, ``producer.py``, ``reward/reward_fn.py``) for its keys. ColossalChat's DAPO
changes no default (its ``rl_example.py`` passes DAPO's values as keys); an estimator that is this engine's
extension may (`coati_relay.algorithms.AlgorithmSpec.defaults`: PPO's). A default may be a function of the given
keys (``critic_lr`` follows ``lr``). ``grpo_config['algo']`` picks the advantage estimator, as ColossalChat's consumer
reads it (``core_algo`` picks the consumer: with a critic for PPO, without for the GRPO family); without it the
estimator is ``core_algo``'s. ``grpo_config`` keys that other fields hold (``OTHER_KEYS``) pass through; keys
ColossalChat has that it never reads either (``IGNORED_GRPO_KEYS``) are accepted with one warning each; any other key is
an error that names the closest valid one.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

from coati_relay import algorithms
from coati_relay.config.checks import (
    LR_SCHEDULERS,
    Check,
    is_flag,
    is_int,
    is_non_negative,
    is_number,
    is_positive,
    is_positive_int,
)
from coati_relay.config.keys import check_section_keys, closest
from coati_relay.config.launch_keywords import config_keys
from coati_relay.config.schema import AlgorithmConfig


def _pair(v: Any) -> bool:
    return v is None or (isinstance(v, (list, tuple)) and len(v) == 2 and all(map(is_number, v)) and v[0] < v[1])


def _tags(v: Any) -> bool:
    """None or ColossalChat's ``response_format_tags``: name -> {"text": str, "num_occur": int >= 0}."""
    return v is None or (isinstance(v, dict) and bool(v) and all(
        isinstance(k, str) and isinstance(t, dict) and set(t) == {"text", "num_occur"} and isinstance(t["text"], str)
        and t["text"] != "" and isinstance(t["num_occur"], int) and not isinstance(t["num_occur"], bool)
        and t["num_occur"] >= 0 for k, t in v.items()))


def _url(v: Any) -> bool:
    return v is None or (isinstance(v, str) and v.startswith(("http://", "https://")))


def _registered(kind: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v.lower() in algorithms.names(kind)


def _registered_names(kind: str) -> Callable[[Any], str]:
    def expect(value: Any) -> str:
        hint = closest(str(value).lower(), algorithms.names(kind))
        return (f"the name of a registered {kind} function, one of {algorithms.names(kind)} (add your own with "
                f"@register({kind!r}, 'name') where the driver imports it, or give an import path "
                f"'module:function'){hint}")
    return expect


ALGORITHM_KEYS: Dict[str, Check] = {
    "lr": Check(is_positive, "a finite number > 0", default=1e-6),
    "critic_lr": Check(is_positive, "a finite number > 0", default=lambda filled: filled["lr"]),
    "weight_decay": Check(is_non_negative, "a number >= 0", default=0.01),
    "beta": Check(is_non_negative, "a number >= 0 (the KL weight)", default=0.01),
    "kl_coef": Check(is_non_negative, "a number >= 0 (PPO's KL reward weight)", default=lambda filled: filled["beta"]),
    "loss_variation": Check(lambda v: v in ("sample_level", "token_level"), "'sample_level' or 'token_level'",
                            default="sample_level"),
    "loss_normalization": Check(lambda v: v in ("step", "colossalchat"), "'step' or 'colossalchat'", default="step"),
    "clip_eps_low": Check(is_positive, "a number > 0", default=0.2),
    "clip_eps_high": Check(is_positive, "a number > 0", default=0.2),
    "filter_range": Check(_pair, "None or [low, high] with low < high", default=None),
    "dynamic_batching": Check(is_flag, "a bool", default=True),
    "soft_over_length_punishment": Check(is_flag, "a bool", default=False),
    "cache_length": Check(lambda v: v is None or is_positive_int(v), "None or an int > 0 (tokens)", default=None),
    "overlength_scale": Check(is_non_negative, "a number >= 0", default=1.0),
    "filter_truncated_response": Check(is_flag, "a bool", default=False),
    "response_format_tags": Check(_tags, "None or {name: {'text': str, 'num_occur': int >= 0}}", default=None),
    "code_verifier_api_url": Check(_url, "None or an http(s) URL", default=None),
    "value_clip": Check(is_positive, "a number > 0", default=0.4),
    "gamma": Check(lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]", default=1.0),
    "lam": Check(lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]", default=0.95),
    "ppo_epochs": Check(is_positive_int, "an int >= 1", default=1),
    "normalize_advantages": Check(is_flag, "a bool", default=False),
    "lr_scheduler": Check(lambda v: v in LR_SCHEDULERS, "None, 'constant', 'cosine' or 'colossalchat'",
                          default="colossalchat"),
    "warmup_steps": Check(lambda v: is_int(v) and v >= 0, "an int >= 0", default=0),
    "max_grad_norm": Check(lambda v: v is None or is_positive(v), "None or a number > 0", default=None),
    "policy_loss": Check(_registered("policy_loss"), _registered_names("policy_loss"), default="ppo_clip"),
    "value_loss": Check(_registered("value_loss"), _registered_names("value_loss"), default="clipped"),
    "kl_estimator": Check(_registered("kl"), _registered_names("kl"), default="k3"),
}

# grpo_config keys that other fields of the schema hold (the estimator, the reward, sizes).
OTHER_KEYS = [key for key in config_keys("grpo_config") if key not in ALGORITHM_KEYS]

# grpo_config keys of ColossalChat that it never reads either, and why they are passed.
IGNORED_GRPO_KEYS = {
    "skip_threshold": "ColossalChat never reads it either (rl_example.py passes it for DAPO)",
    "max_length": "ColossalChat never reads it either (rl_example.py passes prompt + response tokens); prompt "
                  "length is train_dataset_config['max_length'], response length generate_config's",
    "num_minibatch_during_rollout": "ColossalChat never reads it either (rl_example_zero_bubble.py passes it); "
                                    "the zero-bubble entry's buffer is data_actor_buffer_size_limit",
}


def core_algos() -> List[str]:
    """The accepted ``core_algo`` values: the registered advantage estimators, upper-case."""
    return [name.upper() for name in algorithms.names("advantage")]


def build_algorithm(errors: List[str], core_algo: Any, grpo: Mapping[str, Any],
                    num_generations: int) -> Optional[AlgorithmConfig]:
    """The checked `AlgorithmConfig` of ``core_algo`` from ``grpo_config``; problems go to ``errors`` (None then)."""
    if not isinstance(core_algo, str) or core_algo.upper() not in core_algos() or core_algo != core_algo.upper():
        hint = closest(str(core_algo).upper(), core_algos())
        errors.append(f"core_algo must be one of {core_algos()}, got {core_algo!r}{hint}")
        return None
    check_section_keys(errors, "grpo_config", grpo, [*ALGORITHM_KEYS, *OTHER_KEYS], IGNORED_GRPO_KEYS)
    estimator = _estimator(errors, core_algo, grpo.get("algo", core_algo))
    spec = algorithms.spec(estimator)
    if num_generations < spec.min_group_size:
        errors.append(f"{estimator} normalises rewards within a group of num_generations responses per prompt: "
                      f"num_generations must be >= {spec.min_group_size}, got {num_generations}; use "
                      f"core_algo='PPO' for one response")
    values: Dict[str, Any] = {}
    for key, entry in ALGORITHM_KEYS.items():
        default = spec.defaults.get(key, entry.default)
        value = grpo[key] if key in grpo else (default(values) if callable(default) else default)
        if not entry.ok(value):
            expect = entry.expect(value) if callable(entry.expect) else entry.expect
            errors.append(f"grpo_config['{key}'] must be {expect}, got {value!r}")
        values[key] = value
    if values["soft_over_length_punishment"] is True and values["cache_length"] is None:
        errors.append("grpo_config['soft_over_length_punishment'] needs grpo_config['cache_length'] (the tokens "
                      "before max_new_tokens where the penalty grows; ColossalChat's DAPO uses min(1024, "
                      "max_new_tokens // 4))")
    if values["lr_scheduler"] == "colossalchat" and values["warmup_steps"]:
        errors.append(f"grpo_config['warmup_steps']={values['warmup_steps']} needs lr_scheduler 'constant' or "
                      f"'cosine' (this engine's); ColossalChat's schedule ('colossalchat', the default) has no warmup")
    big = grpo.get("max_new_tokens")  # its type is checked with the sampling settings, which fall back on it
    big = big if isinstance(big, int) and not isinstance(big, bool) and big > 0 else None
    return AlgorithmConfig(**values, algo=estimator, max_new_tokens=big)


def _estimator(errors: List[str], core_algo: str, algo: Any) -> str:
    """The advantage estimator: ``grpo_config['algo']`` (ColossalChat's consumer computes the advantage it names),
    within the consumer ``core_algo`` picks: with a critic (PPO) or without (the GRPO family, which ColossalChat
    serves with one consumer class)."""
    if not isinstance(algo, str) or algo.upper() not in core_algos() or algo != algo.upper():
        hint = closest(str(algo).upper(), core_algos())
        errors.append(f"grpo_config['algo'] must be one of {core_algos()}, got {algo!r}{hint}")
        return core_algo
    if algorithms.spec(algo).needs_critic != algorithms.spec(core_algo).needs_critic:
        errors.append(f"grpo_config['algo'] = {algo!r} and core_algo = {core_algo!r}: one trains a critic and the "
                      f"other does not; make them equal (or drop grpo_config['algo'])")
        return core_algo
    return algo
