"""Defaults are declared once, on the schema's fields: `build_run_config`'s keywords take theirs from there, and the
sections fill their own."""
from __future__ import annotations

import dataclasses
import inspect

from coati_relay.assembly.build import build_run_config
from coati_relay.assembly.sampling import DEFAULT_MAX_NEW_TOKENS
from coati_relay.config.meaning import default_of
from coati_relay.config.schema import SECTIONS, SamplingConfig

# keywords whose field holds something made from them, not the keyword's value
DERIVED = {"master_addr": "named by master_port's field, which holds the port",
           "export_dir": "True is run_dir/hf_model, a path the field holds; the field's None is no export"}


def keyword_fields():
    """(keyword, section, field) for every launch keyword that names a schema field with a declared default."""
    for cls in SECTIONS:
        for f in dataclasses.fields(cls):
            meaning = f.metadata.get("meaning")
            declared = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if meaning and declared:
                yield from ((key, cls, f.name) for key in meaning.keys if "[" not in key)


def test_each_keyword_default_is_its_schema_fields():
    params = inspect.signature(build_run_config).parameters
    pairs = [(key, cls, name) for key, cls, name in keyword_fields()
             if key in params and params[key].default is not None]
    assert len(pairs) >= 15, pairs  # every keyword the schema gives a default, not a lucky few
    for key, cls, name in pairs:
        if key not in DERIVED:
            assert params[key].default == default_of(cls, name), (key, cls.__name__, name)


def test_the_response_length_without_any_key_is_the_schemas():
    assert DEFAULT_MAX_NEW_TOKENS == default_of(SamplingConfig, "max_new_tokens") == 16
