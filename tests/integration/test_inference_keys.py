"""The driver's vLLM allow-list (`coati_relay.inference.vllm_spec.VLLM_KEYS`) against the installed vLLM: every key the
driver lets through is an engine argument this vLLM takes, so a checked config never fails inside a producer."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from coati_relay.assembly.inference_config import REFUSED_KEYS
from coati_relay.inference.vllm_spec import VLLM_KEYS, VLLM_REFUSED_KEYS

pytestmark = pytest.mark.slow


def test_allow_listed_vllm_keys_are_engine_arguments_of_the_installed_vllm():
    vllm = pytest.importorskip("vllm")

    fields = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    llm_params = {k for k, p in inspect.signature(vllm.LLM.__init__).parameters.items()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
    missing = sorted(set(VLLM_KEYS) - fields - llm_params)
    assert not missing, f"vLLM {vllm.__version__} has no engine arguments {missing}: update VLLM_KEYS"
    refused_here = set(REFUSED_KEYS) | set(VLLM_REFUSED_KEYS)
    assert refused_here - {"checkpoint_path"} <= fields | llm_params | {"device"}, \
        "the refusals name vLLM's own arguments"
