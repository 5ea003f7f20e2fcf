"""``coati-relay docs [TOPIC]``: the migration guide as installed with the package (`coati_relay.migration.guide`)."""
from __future__ import annotations

from pathlib import Path

import pytest

from coati_relay.migration import guide
from coati_relay.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_pages_are_the_guides():
    assert guide.PAGES.resolve() == (ROOT / "migration_guide").resolve()
    assert set(guide.pages()) == {p.stem for p in (ROOT / "migration_guide").glob("*.md")}
    assert guide.read("rewriter") == (ROOT / "migration_guide" / "rewriter.md").read_text(encoding="utf-8")


def test_a_topic_prints_its_section_only():
    text = guide.read("batch-sizes")
    assert text.startswith("(rewriter.md#batch-sizes)") and "### Batch sizes and rounds" in text
    assert "round_sizes" in text and "### How long a run is" not in text, "stops at the next section"
    assert guide.anchors()["detachedppotrainer"] == "api_map"


def test_the_section_ends_at_the_next_anchor_or_a_heading_as_high():
    lines = ["# Page", '<a id="a"></a>', "## A", "text a", "### A.1", "more", "## B", "text b", '<a id="c"></a>',
             "## C", "text c"]
    assert guide.section(lines, "a") == "## A\ntext a\n### A.1\nmore\n"
    assert guide.section(lines, "c") == "## C\ntext c\n"


def test_cli_lists_prints_and_refuses(capsys):
    assert main(["docs"]) == 0
    listing = capsys.readouterr().out
    assert "rewriter" in listing and "seed-and-save-dir" in listing
    assert main(["docs", "four-role"]) == 0
    assert "### Four-role scripts" in capsys.readouterr().out
    assert main(["docs", "no-such-topic"]) == 2
    err = capsys.readouterr().err
    assert "no guide page or topic 'no-such-topic'" in err and "rewriter" in err


def test_a_missing_installation_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(guide, "PAGES", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="reinstall coati-relay"):
        guide.read("rewriter")
