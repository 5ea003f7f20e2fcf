"""The keys of the configuration sections and their checks: a key the run reads passes, a ColossalChat key without
effect here warns once (with the reason), an unknown key is an error that names the closest valid one. The keys of
``grpo_config`` are in `coati_relay.config.algorithm`; ``tokenizer_config``'s all go to
``AutoTokenizer.from_pretrained``, as in ColossalChat's producer."""
from __future__ import annotations

import difflib
import logging
from typing import Any, Iterable, List, Mapping

log = logging.getLogger(__name__)

# Keys of the other sections that the run reads.
SECTION_KEYS = {"train_dataset_config": ("path", "prompts", "max_length", "system_prompt"),
                "train_model_config": ("path", "checkpoint_path", "lora", "gradient_checkpointing", "keep_dropout",
                                       # passed to from_pretrained (coati_relay.assembly.models.from_pretrained_kwargs)
                                       "use_flash_attention_2", "use_cache", "torch_dtype", "attn_implementation",
                                       "trust_remote_code"),
                "critic_model_config": ("path",), "reward_model_config": ("path",)}
# Keys ColossalChat scripts pass that mean nothing here, and why (generate_config's keys: by backend, in
# coati_relay.inference.generate_keys).
IGNORED_SECTION_KEYS = {
}
# Keywords of ColossalChat's launch_distributed that have no effect here, and why.
IGNORED_LAUNCH_KEYS = {
    "data_actor_buffer_size_limit": "it is the zero-bubble entry's (coati_relay.launch_zero_bubble."
                                    "launch_distributed); this entry's rollout queue is bounded by n_behind",
}

_WARNED: set = set()


def closest(name: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid name closest to ``name``, or an empty string."""
    match = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def warn_ignored(section: str, key: str, reason: str) -> None:
    """One warning per process for a ColossalChat key that has no effect here."""
    if (section, key) not in _WARNED:
        _WARNED.add((section, key))
        log.warning("%s[%r] is accepted for ColossalChat compatibility but has no effect here: %s", section, key,
                    reason)


def check_section_keys(errors: List[str], section: str, given: Mapping[str, Any], used: Iterable[str],
                       ignored: Mapping[str, str]) -> None:
    """``given``'s keys must be in ``used`` (read by the run) or ``ignored`` (key -> why it has no effect)."""
    valid = [*used, *ignored]
    for key in sorted(set(given) - set(valid)):
        errors.append(f"{section} has no key {key!r}{closest(key, valid)}; valid keys: {sorted(valid)}")
    for key in sorted(set(given) & set(ignored)):
        warn_ignored(section, key, ignored[key])
