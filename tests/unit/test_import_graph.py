"""No two packages of the engine import each other. Each subpackage of `coati_relay` is one node, each module at its
top (``launch``, ``checkpoint``, ...) one node, the package's ``__init__`` one more; an import anywhere in a file,
function-level ones included, is an arrow from its node to the node it names. Where two nodes point at each other,
one of them stands above the other and below it at once: the layering the arrows should show is lost."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Tuple

ENGINE = Path(__file__).resolve().parents[2] / "backend" / "coati_relay"


def node_of(root: Path, path: Path) -> str:
    """The node of the file at ``path`` in the package at ``root``."""
    parts = path.relative_to(root).parts
    if len(parts) > 1:
        return parts[0]
    return "__init__" if parts[0] == "__init__.py" else parts[0][:-3]


def named_nodes(root: Path, node: ast.AST) -> List[str]:
    """The nodes an import statement names (``from coati_relay import x``: x where it is a submodule or subpackage,
    else the package's ``__init__``)."""
    package = root.name
    if isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        modules = [node.module]
        if node.module == package:
            modules = [f"{package}.{alias.name}" if (root / alias.name).is_dir()
                       or (root / f"{alias.name}.py").is_file() else package for alias in node.names]
    else:
        return []
    out = []
    for module in modules:
        parts = module.split(".")
        if parts[0] == package:
            out.append(parts[1] if len(parts) > 1 else "__init__")
    return out


def arrows(root: Path) -> Dict[Tuple[str, str], List[str]]:
    """(from node, to node) -> the imports making that arrow, as ``file:line``."""
    found: Dict[Tuple[str, str], List[str]] = {}
    for path in sorted(root.rglob("*.py")):
        source = node_of(root, path)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in named_nodes(root, node):
                if target != source:
                    found.setdefault((source, target), []).append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def mutual_imports(root: Path) -> List[str]:
    """Each pair of nodes importing each other, with the imports of both ways."""
    edges = arrows(root)
    return [f"{a} <-> {b}: {edges[(a, b)][:3]} and {edges[(b, a)][:3]}"
            for a, b in sorted(edges) if a < b and (b, a) in edges]


def test_no_two_packages_of_the_engine_import_each_other():
    assert len(arrows(ENGINE)) > 50, "the engine's imports were not read"
    assert mutual_imports(ENGINE) == []


def test_a_planted_cycle_is_found(tmp_path):
    root = tmp_path / "coati_relay"
    for package in ("config", "inference"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("from coati_relay import launch\n")
    (root / "launch.py").write_text("from coati_relay.config import schema\n")
    (root / "config" / "schema.py").write_text("X = 1\n")
    (root / "inference" / "backend.py").write_text("from coati_relay.config.schema import X\n")
    assert mutual_imports(root) == []
    (root / "config" / "build.py").write_text("def build():\n    from coati_relay.inference import backend\n")
    (root / "config" / "hook.py").write_text("from coati_relay import launch\n")
    assert mutual_imports(root) == [
        "config <-> inference: ['config/build.py:2'] and ['inference/backend.py:1']",
        "config <-> launch: ['config/hook.py:1'] and ['launch.py:1']"]
