"""The migration guide has an anchor for every link the deprecation warnings print."""
from __future__ import annotations

import re
from pathlib import Path

from coati_compat.imports.deprecations import DEPRECATIONS

ROOT = Path(__file__).resolve().parents[3]


def test_every_warning_link_resolves_to_an_anchor():
    anchors = {}
    for name, dep in DEPRECATIONS.items():
        path, _, anchor = dep.anchor.partition("#")
        anchors.setdefault(path, set()).add(anchor)
    for path, wanted in anchors.items():
        text = (ROOT / path).read_text()
        have = set(re.findall(r'<a id="([^"]+)"></a>', text))
        assert wanted <= have, f"{path} lacks anchors {sorted(wanted - have)}"


def test_guide_files_exist_and_link_each_other():
    guide = ROOT / "migration_guide"
    for name in ("README.md", "api_map.md", "deviations.md"):
        assert (guide / name).is_file(), name
    assert "deviations.md" in (guide / "README.md").read_text()


def test_api_map_is_current_with_the_deprecation_table():
    from coati_compat.api_map import render

    assert (ROOT / "migration_guide" / "api_map.md").read_text() == render(), \
        "regenerate with: python -m coati_compat.api_map"
