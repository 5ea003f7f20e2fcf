"""examples/migrated/ is what the rewriter makes of examples/legacy/ today (regenerate with `coati-relay migrate`)."""
from __future__ import annotations

from pathlib import Path

import pytest

from coati_compat.migrate import migrate_file

ROOT = Path(__file__).resolve().parents[3]
LEGACY = sorted((ROOT / "examples" / "legacy").glob("*.py"))


@pytest.mark.parametrize("legacy", LEGACY, ids=[p.stem for p in LEGACY])
def test_migrated_example_is_current(legacy):
    migrated = ROOT / "examples" / "migrated" / legacy.name
    assert migrated.is_file(), f"run: coati-relay migrate {legacy.relative_to(ROOT)} -o {migrated.relative_to(ROOT)}"
    assert migrate_file(legacy).script == migrated.read_text(), (
        f"{migrated.name} is stale; run: coati-relay migrate examples/legacy/{legacy.name} -o examples/migrated/")
