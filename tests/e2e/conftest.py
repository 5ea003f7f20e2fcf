"""Fixtures of the end-to-end tests (helpers live in run_helpers.py)."""
from __future__ import annotations

import pytest

from coati_relay.toy import write_toy_dataset


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """The toy task's prompts: 8 of them, in a JSONL file."""
    return write_toy_dataset(tmp_path_factory.mktemp("e2e") / "toy.jsonl", num_prompts=8)
