"""The algorithm section of a run (ColossalChat's ``grpo_config``): one table of key, default and check, typed.

``ALGORITHM_KEYS`` lists every setting `AlgorithmConfig` holds. The default of a setting is the table's, unless the
run's estimator overrides it (`coati_relay.algorithms.AlgorithmSpec.defaults`, e.g. DAPO's ``beta = 0``); a default
may be a function of the given keys (``critic_lr`` follows ``lr``). ``grpo_config`` keys read by other sections
(``OTHER_KEYS``) pass through; keys ColossalChat has that mean nothing here (``IGNORED_KEYS``) are accepted with one
warning each; any other key is an error that names the closest valid one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence

from coati_relay import algorithms
from coati_relay.config.checks import is_flag, is_non_negative, is_number, is_positive
from coati_relay.config.keys import check_section_keys, closest


def _pair(v: Any) -> bool:
    return v is None or (isinstance(v, (list, tuple)) and len(v) == 2 and all(map(is_number, v)) and v[0] < v[1])


class Key(NamedTuple):
    """default: a value, or a function of the given keys; check: True for a valid value; expect: what is valid (or
    a function of the value that says it); help: what the setting does, where its name does not say it."""

    default: Any
    check: Callable[[Any], bool]
    expect: Any
    help: str = ""


def _registered(kind: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v.lower() in algorithms.names(kind)


def _registered_names(kind: str) -> Callable[[Any], str]:
    def expect(value: Any) -> str:
        hint = closest(str(value).lower(), algorithms.names(kind))
        return (f"the name of a registered {kind} function, one of {algorithms.names(kind)} (add your own with "
                f"@register({kind!r}, 'name') where the driver imports it){hint}")
    return expect


ALGORITHM_KEYS: Dict[str, Key] = {
    "lr": Key(1e-6, is_positive, "a finite number > 0"),
    "critic_lr": Key(lambda given: given.get("lr", 1e-6), is_positive, "a finite number > 0"),
    "weight_decay": Key(0.01, is_non_negative, "a number >= 0"),
    "beta": Key(0.01, is_non_negative, "a number >= 0 (the KL weight)"),
    "kl_coef": Key(lambda given: given.get("beta", 0.01), is_non_negative, "a number >= 0 (PPO's KL reward weight)"),
    "loss_variation": Key("sample_level", lambda v: v in ("sample_level", "token_level"),
                          "'sample_level' or 'token_level'"),
    "clip_eps_low": Key(0.2, is_positive, "a number > 0"),
    "clip_eps_high": Key(0.2, is_positive, "a number > 0"),
    "filter_range": Key(None, _pair, "None or [low, high] with low < high"),
    "soft_over_length_punishment": Key(False, is_flag, "a bool"),
    "cache_length": Key(None, lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
                        "None or an int > 0 (tokens)"),
    "overlength_scale": Key(1.0, is_non_negative, "a number >= 0"),
    "filter_truncated_response": Key(False, is_flag, "a bool"),
    "value_clip": Key(0.4, is_positive, "a number > 0"),
    "gamma": Key(1.0, lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "lam": Key(0.95, lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "ppo_epochs": Key(1, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an int >= 1"),
    "normalize_advantages": Key(False, is_flag, "a bool"),
    "lr_scheduler": Key("constant", lambda v: v in (None, "constant", "cosine"), "None, 'constant' or 'cosine'"),
    "warmup_steps": Key(0, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an int >= 0"),
    "max_grad_norm": Key(None, lambda v: v is None or is_positive(v), "None or a number > 0"),
    "policy_loss": Key("ppo_clip", _registered("policy_loss"), _registered_names("policy_loss"),
                       "the policy loss the learner calls, by its registered name: 'ppo_clip' is the clipped "
                       "surrogate with an asymmetric clip and beta * KL (coati_relay.algorithms.losses)"),
    "value_loss": Key("clipped", _registered("value_loss"), _registered_names("value_loss"),
                      "the critic's loss (algorithms with a critic: PPO), by its registered name: 'clipped' is the "
                      "clipped value loss with value_clip"),
    "kl_estimator": Key("k3", _registered("kl"), _registered_names("kl"),
                        "the per-token KL(policy || reference) estimator of the beta term, in the policy loss "
                        "(GRPO, DAPO, RLOO) or folded into REINFORCE++'s advantages: 'k1' (logp - ref_logp), 'k2' "
                        "((ref_logp - logp)^2 / 2) or 'k3' (exp(x) - 1 - x, x = ref_logp - logp); PPO's rewards "
                        "carry k1 whatever this says"),
}

# grpo_config keys that other parts of the configuration read.
OTHER_KEYS = {"algo": "must equal core_algo", "reward_fn_type": "the reward", "reward_fn": "the reward",
              "train_microbatch_size": "sequences per forward", "max_new_tokens": "response length"}

# grpo_config keys of ColossalChat that have no effect here, and why.
IGNORED_KEYS = {
    "dynamic_batching": "groups outside filter_range are masked out of the loss; no further prompts are drawn",
    "skip_threshold": "ColossalChat never reads it either",
    "code_verifier_api_url": "there is no code-execution reward here",
    "response_format_tags": "the math rewards check their own tags",
    "max_length": "prompt length is train_dataset_config['max_length'], responses generate_config's",
}


@dataclass(frozen=True)
class AlgorithmConfig:
    """The algorithm settings of a run, one field per ``ALGORITHM_KEYS`` entry."""

    lr: float
    critic_lr: float
    weight_decay: float
    beta: float
    kl_coef: float
    loss_variation: str
    clip_eps_low: float
    clip_eps_high: float
    filter_range: Optional[Sequence[float]]
    soft_over_length_punishment: bool
    cache_length: Optional[int]
    overlength_scale: float
    filter_truncated_response: bool
    value_clip: float
    gamma: float
    lam: float
    ppo_epochs: int
    normalize_advantages: bool
    lr_scheduler: Optional[str]
    warmup_steps: int
    max_grad_norm: Optional[float]
    policy_loss: str
    value_loss: str
    kl_estimator: str


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
    spec = algorithms.spec(core_algo)
    check_section_keys(errors, "grpo_config", grpo, [*ALGORITHM_KEYS, *OTHER_KEYS], IGNORED_KEYS)
    if grpo.get("algo", core_algo) != core_algo:
        errors.append(f"grpo_config['algo'] = {grpo['algo']!r} disagrees with core_algo = {core_algo!r}; make them "
                      f"equal (or drop grpo_config['algo'])")
    if num_generations < spec.min_group_size:
        errors.append(f"{core_algo} normalises rewards within a group of num_generations responses per prompt: "
                      f"num_generations must be >= {spec.min_group_size}, got {num_generations}; use "
                      f"core_algo='PPO' for one response")
    values: Dict[str, Any] = {}
    for key, entry in ALGORITHM_KEYS.items():
        default = spec.defaults.get(key, entry.default)
        value = grpo[key] if key in grpo else (default(grpo) if callable(default) else default)
        if not entry.check(value):
            expect = entry.expect(value) if callable(entry.expect) else entry.expect
            errors.append(f"grpo_config['{key}'] must be {expect}, got {value!r}")
        values[key] = value
    return AlgorithmConfig(**values)
