"""A fake inference backend, ``"fake"``, for tests/unit/test_backend_registry.py: transformers' generation under its
own name and spec, holding its own copy of the checkpoint (so a colocated run hands it every trained version). It
takes one engine key of its own, ``label``, and records the keywords of every backend it builds."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List

from coati_relay.config.checks import Check
from coati_relay.inference import backend_spec

BUILT: List[Dict[str, Any]] = []  # the keywords of each backend built, ``label`` included


def _build(model_path: str, sampling, label: str = "", **kwargs):
    BUILT.append({"label": label, **kwargs})
    return backend_spec("transformers").build(model_path, sampling, **kwargs)


SPEC = replace(backend_spec("transformers"), name="fake", build=_build, generates_in_place=False, in_place_keys=(),
               engine_keys={"label": Check(lambda v: isinstance(v, str), "a str")})
