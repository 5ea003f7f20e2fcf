"""Every field of the config schema says what it means, beside it; every launch keyword resolves to a meaning; the
config keys the schema names are keys the sections accept."""
from __future__ import annotations

import dataclasses
from typing import List

import pytest

from coati_relay.assembly.build import keyword_names
from coati_relay.config import schema
from coati_relay.config.algorithm import ALGORITHM_KEYS, OTHER_KEYS
from coati_relay.config.keys import SECTION_KEYS
from coati_relay.config.launch_keywords import config_keys, keyword_meaning
from coati_relay.config.meaning import CC, EXT, field_meanings, meaning


def missing_meanings(classes) -> List[str]:
    """``Class.field`` for each field without a meaning (an origin and a text)."""
    return [f"{cls.__name__}.{name}" for cls in classes for name, m in field_meanings(cls).items()
            if m is None or not m.origin or not m.text.strip()]


def test_every_field_of_every_section_has_a_meaning():
    sections = [c for c in vars(schema).values() if dataclasses.is_dataclass(c) and c.__module__ == schema.__name__]
    assert sorted(c.__name__ for c in sections) == sorted(c.__name__ for c in schema.SECTIONS)
    assert missing_meanings(schema.SECTIONS) == []


def test_a_field_without_a_meaning_is_found():
    @dataclasses.dataclass
    class Planted:
        said: int = meaning(EXT, "a field that says what it is", default=0)
        bare: int = 0

    assert missing_meanings([Planted]) == ["Planted.bare"]


@pytest.mark.parametrize("keyword", [*keyword_names(), "data_actor_buffer_size_limit"])
def test_every_launch_keyword_resolves_to_a_meaning(keyword):
    origin, text = keyword_meaning(keyword)
    assert origin in (CC, EXT) and text.strip()


def test_a_keyword_the_schema_does_not_name_has_no_meaning():
    with pytest.raises(KeyError, match="no_such_keyword"):
        keyword_meaning("no_such_keyword")


def test_a_config_key_s_meaning_is_an_item_of_its_keyword():
    origin, text = keyword_meaning("grpo_config")
    assert origin == CC and "\n'lr': the policy's learning rate\n" in text
    assert "\n'kl_estimator' (extension): the per-token KL" in text
    assert keyword_meaning("plugin_config")[1].splitlines()[1] == "'max_norm': as grpo_config['max_grad_norm']"


def test_the_keys_the_schema_names_are_keys_the_sections_accept():
    grpo = config_keys("grpo_config")
    assert set(ALGORITHM_KEYS) <= set(grpo) and sorted(OTHER_KEYS) == sorted(set(grpo) - set(ALGORITHM_KEYS))
    assert {"algo", "reward_fn_type", "reward_fn", "train_microbatch_size", "max_new_tokens"} == set(OTHER_KEYS)
    for section, accepted in SECTION_KEYS.items():
        assert set(config_keys(section)) <= set(accepted), section
