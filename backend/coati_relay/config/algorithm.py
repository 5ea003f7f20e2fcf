"""The algorithm section of a run (ColossalChat's ``grpo_config``), filled and checked into an `AlgorithmConfig`.

``ALGORITHM_KEYS`` lists every setting `AlgorithmConfig` holds with its check and default, which each field of the
schema declares beside its meaning: ColossalChat's defaults (4f9953be3,
``grpo_consumer.py``, ``consumer.py``, ``producer.py``, ``reward/reward_fn.py``) for its keys. ColossalChat's DAPO
changes no default (its ``rl_example.py`` passes DAPO's values as keys); an estimator that is this engine's
extension may (`coati_relay.algorithms.AlgorithmSpec.defaults`: PPO's). A default may be a function of the keys
before it (``critic_lr`` follows ``lr``). ``grpo_config['algo']`` picks the advantage estimator, as ColossalChat's
consumer reads it (``core_algo`` picks the consumer: with a critic for PPO, without for the GRPO family); without it
the estimator is ``core_algo``'s. ``grpo_config`` keys that other fields hold (``OTHER_KEYS``) pass through; keys
ColossalChat has that it never reads either (``IGNORED_GRPO_KEYS``) are accepted with one warning each; any other key is
an error that names the closest valid one.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from coati_relay import algorithms
from coati_relay.config.checks import Check
from coati_relay.config.keys import check_section_keys, closest
from coati_relay.config.launch_keywords import config_keys
from coati_relay.config.meaning import field_checks
from coati_relay.config.schema import AlgorithmConfig

# grpo_config key -> its check and default, in the schema's field order (each field declares them)
ALGORITHM_KEYS: Dict[str, Check] = field_checks(AlgorithmConfig)

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
