"""The config's predicates exist once (`coati_relay.config.checks`) and every section reads numbers the same way:
infinity and NaN are refused wherever a number is asked for, bools are never numbers."""
from __future__ import annotations

import math

import pytest

from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.config.checks import is_flag, is_int, is_number, is_positive_int
from tests.unit.small_run import small_run_kwargs


@pytest.mark.parametrize("value, number, integer", [(3, True, True), (2.5, True, False), (True, False, False),
                                                    (math.inf, False, False), (math.nan, False, False),
                                                    ("3", False, False), (None, False, False)])
def test_one_reading_of_a_number(value, number, integer):
    assert is_number(value) is number and is_int(value) is integer


def test_flags_and_positive_ints():
    assert is_flag(False) and not is_flag(0)
    assert is_positive_int(1) and not is_positive_int(0) and not is_positive_int(True)


@pytest.mark.parametrize("over, names", [
    ({"placement_timeout_s": math.inf}, "placement_timeout_s"),
    ({"timeout_s": math.inf}, "timeout_s"),
    ({"grpo_config": {"lr": math.inf, "reward_fn_type": "toy_letter"}}, "lr"),
    ({"generate_config": {"max_new_tokens": 4, "temperature": math.inf}}, "temperature"),
    ({"train_model_config": {"path": None, "lora": {"r": 2, "alpha": math.inf}}}, "alpha"),
])
def test_every_section_refuses_infinity(tmp_path, tiny_model_path, over, names):
    kw = small_run_kwargs(tmp_path, tiny_model_path, **over)
    if "train_model_config" in over:
        kw["train_model_config"]["path"] = tiny_model_path
    with pytest.raises(ConfigError, match=names):
        build_run_config(**kw)
