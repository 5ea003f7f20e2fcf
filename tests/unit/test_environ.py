"""restore_environ puts os.environ back key by key."""
from __future__ import annotations

import os

from coati_relay.cluster.environ import restore_environ


def test_added_removed_and_changed_variables_are_put_back(monkeypatch):
    monkeypatch.setenv("COATI_RELAY_TEST_KEPT", "same")
    monkeypatch.setenv("COATI_RELAY_TEST_CHANGED", "before")
    monkeypatch.setenv("COATI_RELAY_TEST_REMOVED", "there")
    saved = dict(os.environ)
    os.environ["COATI_RELAY_TEST_ADDED"] = "1"
    os.environ["COATI_RELAY_TEST_CHANGED"] = "after"
    del os.environ["COATI_RELAY_TEST_REMOVED"]
    restore_environ(saved)
    assert "COATI_RELAY_TEST_ADDED" not in os.environ
    assert os.environ["COATI_RELAY_TEST_CHANGED"] == "before"
    assert os.environ["COATI_RELAY_TEST_REMOVED"] == "there"
    assert dict(os.environ) == saved
