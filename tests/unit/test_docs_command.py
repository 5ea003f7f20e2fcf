"""``coati-relay docs [TOPIC]``: the migration guide as installed with the package (`coati_relay.migration.guide`)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from coati_relay.cli import main
from coati_relay.migration import guide

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


def test_a_built_wheel_carries_the_pages(tmp_path):
    """setup.py copies migration_guide/ into the wheel (no link, no second copy in the repository); the installed
    package reads its own copy."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("backend", "compat", "migration_guide"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    build = "from setuptools import build_meta; print(build_meta.build_wheel(%r))" % str(tmp_path / "dist")
    done = subprocess.run([sys.executable, "-c", build], cwd=src, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    with zipfile.ZipFile(tmp_path / "dist" / done.stdout.split()[-1]) as wheel:
        pages = {n.rsplit("/", 1)[1]: n for n in wheel.namelist() if n.startswith("coati_relay/migration/pages/")}
        assert sorted(pages) == sorted(p.name for p in (ROOT / "migration_guide").glob("*.md"))
        assert wheel.read(pages["rewriter.md"]) == (ROOT / "migration_guide" / "rewriter.md").read_bytes()
        wheel.extractall(tmp_path / "site")
    show = "from coati_relay.migration import guide; print(guide.PAGES); print(guide.read('four-role')[:40])"
    done = subprocess.run([sys.executable, "-c", show], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(str(tmp_path / "site" / "coati_relay" / "migration" / "pages"))
    assert "(rewriter.md#four-role)" in done.stdout
