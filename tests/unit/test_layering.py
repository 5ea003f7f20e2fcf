"""DESIGN's one-way layering, checked on the source: the engine never imports the legacy layer, compat enters the
engine only through `coati_relay` and `coati_relay.parts`, the legacy runtime never imports the tools that sit on
top of it (they observe through `coati_compat.observers` and entry points), and the legacy layer
(`coati_compat.legacy`) never imports the shims above it."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "backend" / "coati_relay"
LEGACY_RUNTIME = [ROOT / "compat" / "coati_compat" / part for part in ("legacy", "shims")]
TOOLS = ("coati_compat.compare", "coati_compat.migrate")


def imported_modules(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, module) of every import in ``path``, function-level imports included."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def offending(roots, banned) -> list:
    return [f"{path.relative_to(ROOT)}:{line} imports {module}"
            for root in roots for path in sorted(root.rglob("*.py"))
            for line, module in imported_modules(path)
            if any(module == b or module.startswith(b + ".") for b in banned)]


def test_the_engine_never_imports_the_legacy_layer():
    assert list(ENGINE.rglob("*.py")), "the engine's sources were not found"
    assert offending([ENGINE], ("coati_compat", "coati")) == []


def test_the_legacy_runtime_never_imports_the_tools():
    assert all(list(root.rglob("*.py")) for root in LEGACY_RUNTIME)
    assert offending(LEGACY_RUNTIME, TOOLS) == []


LEGACY = ROOT / "compat" / "coati_compat" / "legacy"
SHIMS = "coati_compat.shims"


def shim_imports(root: Path) -> list:
    """Imports under ``root`` of the shims (``import coati_compat.shims...``, ``from coati_compat.shims... import``
    or ``from coati_compat import shims``): the legacy layer sits below the shims and never reaches up to them."""
    found = offending_under(root, (SHIMS,))
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "coati_compat"
                    and any(alias.name == "shims" for alias in node.names)):
                found.append(f"{path.relative_to(root)}:{node.lineno} imports {SHIMS}")
    return found


def offending_under(root: Path, banned) -> list:
    return [f"{path.relative_to(root)}:{line} imports {module}"
            for path in sorted(root.rglob("*.py"))
            for line, module in imported_modules(path)
            if any(module == b or module.startswith(b + ".") for b in banned)]


def test_the_legacy_layer_never_imports_the_shims():
    assert list(LEGACY.rglob("*.py")), "the legacy layer's sources were not found"
    assert shim_imports(LEGACY) == []


def test_a_planted_shim_import_is_refused(tmp_path):
    (tmp_path / "ok.py").write_text("from coati_relay.parts import accelerator_device\nimport coati_compat.shimsX\n")
    (tmp_path / "up.py").write_text("def f():\n    from coati_compat.shims.device import compute_device\n")
    (tmp_path / "pkg.py").write_text("from coati_compat import observers, shims\n")
    assert shim_imports(tmp_path) == ["up.py:2 imports coati_compat.shims.device",
                                      "pkg.py:1 imports coati_compat.shims"]


COMPAT = ROOT / "compat" / "coati_compat"
ENGINE_DOORS = ("coati_relay", "coati_relay.parts")


def deep_engine_imports(root: Path) -> list:
    """Imports under ``root`` of any engine module other than its two doors."""
    return [f"{path.relative_to(root)}:{line} imports {module}"
            for path in sorted(root.rglob("*.py"))
            for line, module in imported_modules(path)
            if module.startswith("coati_relay") and module not in ENGINE_DOORS]


def test_compat_reaches_the_engine_only_through_its_two_doors():
    assert list(COMPAT.rglob("*.py")), "the legacy package's sources were not found"
    assert deep_engine_imports(COMPAT) == []


def test_a_planted_deep_import_is_refused(tmp_path):
    (tmp_path / "ok.py").write_text("from coati_relay import launch_distributed\nfrom coati_relay.parts import kl_k3\n")
    (tmp_path / "deep.py").write_text("def f():\n    from coati_relay.training.plugins import PLUGINS\n")
    assert deep_engine_imports(tmp_path) == ["deep.py:2 imports coati_relay.training.plugins"]


def test_every_published_part_resolves():
    from coati_relay import parts

    assert parts.__all__ and all(getattr(parts, name) is not None for name in parts.__all__)
    with pytest.raises(AttributeError, match="the published parts are"):
        parts.no_such_part  # noqa: B018


def backend_probes(root: Path) -> list:
    """``getattr(<something named *backend*>, ...)`` calls under ``root``: the capability probes `InferenceBackend`
    makes needless by declaring every member."""
    return [f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}"
            for path in sorted(root.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and node.args and "backend" in ast.unparse(node.args[0]).lower()]


def test_no_caller_probes_an_inference_backend(tmp_path):
    (tmp_path / "probe.py").write_text("def f(self):\n    return getattr(self.backend, 'sleep', None)\n")
    assert backend_probes(tmp_path) == ["probe.py:2 getattr(self.backend, 'sleep', None)"]
    assert backend_probes(ENGINE) == [] and backend_probes(COMPAT) == []


def test_the_check_sees_function_level_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from coati_compat.compare.recording import maker_callbacks\n")
    assert list(imported_modules(source)) == [(2, "coati_compat.compare.recording")]


def test_observers_come_from_the_modules_the_variable_names(tmp_path, monkeypatch):
    from coati_compat import observers
    from coati_compat.compare import recording, recording_switch

    monkeypatch.delenv(observers.ENV, raising=False)
    assert observers.trainer_observers() == [] and observers.maker_observers(object()) == []
    for key, value in recording_switch.recording_env(str(tmp_path)).items():
        monkeypatch.setenv(key, value)
    (trainer,) = observers.trainer_observers()
    (maker,) = observers.maker_observers(object())
    assert isinstance(trainer, recording.TrainerRecorder) and isinstance(maker, recording.MakerRecorder)
    monkeypatch.setenv(observers.ENV, "no_such_observer_module")
    with pytest.raises(ImportError, match="COATI_RELAY_LEGACY_OBSERVERS names 'no_such_observer_module'"):
        observers.trainer_observers()


def test_the_demo_takes_the_legacy_row_from_the_legacy_package():
    from importlib.metadata import entry_points

    from coati_compat.demo_legacy import demo_row
    from coati_relay.demo import DEMO_ROWS_GROUP

    rows = {entry.name: entry.load() for entry in entry_points(group=DEMO_ROWS_GROUP)}
    assert rows == {"legacy": demo_row}, "pyproject.toml registers coati_compat's row (reinstall after editing it)"


def test_the_engine_keeps_at_most_twelve_top_level_modules():
    modules = sorted(p.stem for p in ENGINE.glob("*.py"))
    assert "launch" in modules and len(modules) <= 12, (
        f"backend/coati_relay/ has {len(modules)} top-level modules ({', '.join(modules)}); the front door keeps 12 "
        "at most: put a new module into the sub-package that holds its kind (config/, observe/, migration/, ...)")
