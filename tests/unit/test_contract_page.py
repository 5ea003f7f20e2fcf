"""The contract page (migration_guide/colossalchat_contract.md) against ColossalChat's keys and this repo's tests.

Every keyword of ColossalChat's ``launch_distributed`` and every config key its code reads (the data of
``tests/unit/compat/test_colossalchat_contract.py``) has a row, and every test a row names exists: a renamed or
removed test breaks this test, not silently the page.
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from tests.unit.compat.test_colossalchat_contract import (
    DATASET_KEYS,
    GENERATE_READ,
    GRPO_READ,
    LAUNCH_PARAMETERS,
    MODEL_KEYS,
)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "migration_guide" / "colossalchat_contract.md"
HEADER = "| key | ColossalChat's meaning (file:function at 4f9953be3) | ours | test |"
# "tests/unit/test_x.py" or a bare "test_x.py"; "test_x" or "test_x_*" (a prefix) not followed by ".py".
FILE_REF = re.compile(r"(?:[\w./-]*/)?test_\w+\.py")
TEST_REF = re.compile(r"\btest_\w+(?!\w|\.py)(\*)?")


def page_rows(text: str) -> List[Tuple[str, str, str, str]]:
    """The (key, meaning, ours, test) cells of every row of every contract table in ``text``."""
    rows, in_table = [], False
    for line in text.splitlines():
        if line.strip() == HEADER:
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if in_table and not line.startswith("|---"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            assert len(cells) == 4, f"a contract row needs 4 cells, not {len(cells)}: {line[:80]}"
            rows.append(tuple(cells))
    return rows


@lru_cache(maxsize=None)
def defined_tests() -> Tuple[Set[str], Dict[str, Path]]:
    """Names of the test functions defined under tests/ (ast, methods included) and test files by basename."""
    names, files = set(), {}
    for path in (ROOT / "tests").rglob("*.py"):
        files.setdefault(path.name, path)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                names.add(node.name)
    return names, files


def unresolved(test_cell: str) -> List[str]:
    """The references of one test cell that name no file or test function of tests/."""
    names, files = defined_tests()
    bad = []
    for ref in FILE_REF.findall(test_cell):
        exists = (ROOT / ref).is_file() if "/" in ref else ref in files
        if not exists:
            bad.append(ref)
    for m in TEST_REF.finditer(FILE_REF.sub(" ", test_cell)):
        name, prefix = m.group(0).rstrip("*"), m.group(1)
        if not (any(n.startswith(name) for n in names) if prefix else name in names):
            bad.append(m.group(0))
    return bad


def keys_without_row(keys, rows) -> List[str]:
    """The keys that appear as a whole word in no row's key cell."""
    key_cells = " ".join(row[0] for row in rows)
    return [k for k in keys if not re.search(rf"(?<!\w){re.escape(k)}(?!\w)", key_cells)]


def test_every_colossalchat_keyword_and_config_key_has_a_row():
    rows = page_rows(PAGE.read_text())
    assert len(rows) > 50
    for what, keys in (("launch_distributed keyword", [name for name, _ in LAUNCH_PARAMETERS]),
                       ("grpo_config key", GRPO_READ), ("generate_config key", GENERATE_READ),
                       ("train_dataset_config key", DATASET_KEYS), ("model config key", MODEL_KEYS)):
        assert not keys_without_row(keys, rows), f"{what}s without a row: {keys_without_row(keys, rows)}"


def test_every_test_the_page_names_exists():
    broken = {row[0]: unresolved(row[3]) for row in page_rows(PAGE.read_text())}
    broken = {key: refs for key, refs in broken.items() if refs}
    assert not broken, f"rows naming tests that do not exist: {broken}"


def test_a_planted_row_naming_a_missing_test_fails():
    planted = PAGE.read_text().replace(
        HEADER + "\n|---|---|---|---|\n",
        HEADER + "\n|---|---|---|---|\n| `planted_key` | x | y | tests/unit/test_nowhere.py::test_absent, "
                 "test_grpo_config_keys.py::test_no_such_test, ::test_colossalchat_plugin_*, ::test_zz_prefix_* |\n", 1)
    rows = page_rows(planted)
    assert rows[0][0] == "`planted_key`"
    assert unresolved(rows[0][3]) == ["tests/unit/test_nowhere.py", "test_absent", "test_no_such_test",
                                      "test_zz_prefix_*"]
    assert keys_without_row(["planted_key", "num_absent_key"], rows) == ["num_absent_key"]
    with pytest.raises(AssertionError, match="4 cells"):
        page_rows(HEADER + "\n| a | b | c |\n")
