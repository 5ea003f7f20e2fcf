"""The import finder: legacy paths served from coati_compat through the .pth hook, alone and beside a ColossalChat
``coati`` package (whose non-legacy modules keep coming from it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import colossalchat_head
import pytest

from coati_compat.imports import finder, install_pth

REPO = Path(__file__).resolve().parents[3]
SRC_ROOTS = [str(REPO / "backend"), str(REPO / "compat")]
PURELIB = sysconfig.get_paths()["purelib"]

# Legacy modules served by coati_compat.legacy, with their targets.
LEGACY_MODULES = {
    "coati.ray.utils": "coati_compat.legacy.ray_utils",
    "coati.ray.callbacks": "coati_compat.legacy.callbacks",
    "coati.ray.lora_constructor": "coati_compat.legacy.lora",
    "coati.experience_maker": "coati_compat.legacy.experience_maker",
    "coati.experience_buffer.utils": "coati_compat.legacy.experience",
    "coati.trainer.strategies": "coati_compat.legacy.strategies",
    "coati.models": "coati_compat.legacy.models",
    "coati.models.gpt": "coati_compat.legacy.model_families",
    "coati.quant": "coati_compat.legacy.quant",
}


def run_isolated(code: str, extra_path: tuple = ()) -> dict:
    """Runs ``code`` in ``python -S`` with only the source roots, ``extra_path`` and site-packages on sys.path
    (no .pth of the environment processed); the code prints one JSON line, returned parsed."""
    prelude = (f"import sys; sys.path[:0] = {list(extra_path) + SRC_ROOTS!r}; sys.path.append({PURELIB!r})\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run([sys.executable, "-S", "-c", prelude + textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pth_file_matches_installer_line():
    assert (REPO / "compat" / install_pth.PTH_NAME).read_text() == install_pth.PTH_LINE


def test_write_pth_rejects_missing_dir(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        install_pth.write_pth(str(tmp_path / "nope"))


def test_find_spec_ignores_other_names():
    legacy_finder = finder.LegacyFinder()
    assert legacy_finder.find_spec("json") is None
    assert legacy_finder.find_spec("coatiX") is None
    assert legacy_finder.find_spec("coati.distributed") is None
    assert legacy_finder.find_spec("coati.ray.utils").name == "coati.ray.utils"


@pytest.mark.slow
def test_legacy_paths_through_pth_in_temp_site_dir(tmp_path):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    subprocess.run([sys.executable, "-m", "coati_compat.imports.install_pth", "--site-dir", str(site_dir)], check=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(SRC_ROOTS)}, timeout=60)
    assert (site_dir / install_pth.PTH_NAME).is_file()
    out = run_isolated(f"""
        import importlib, json, site, sys, warnings
        before = "coati_compat.imports.finder" in sys.modules
        site.addsitedir({str(site_dir)!r})
        after_startup = {{"finder": "coati_compat.imports.finder" in sys.modules, "torch": "torch" in sys.modules}}
        warnings.simplefilter("ignore", FutureWarning)
        same = {{}}
        for legacy, target in {LEGACY_MODULES!r}.items():
            same[legacy] = importlib.import_module(legacy) is importlib.import_module(target)
        from coati.ray.utils import get_actor_from_args, get_receivers_per_sender
        from coati.quant import llama_load_quant, low_resource_init
        from transformers.modeling_utils import no_init_weights
        print(json.dumps({{"before": before, "after": after_startup, "same": same,
                          "coati_file": getattr(sys.modules["coati"], "__file__", None)}}))
    """)
    assert out["before"] is False
    assert out["after"] == {"finder": True, "torch": False}
    assert out["same"] == {k: True for k in LEGACY_MODULES}
    assert out["coati_file"] is None


IMPORT_ALL = """
    import importlib, json, sys, warnings
    if {with_relay}:
        import coati_compat.imports.finder
        coati_compat.imports.finder.install()
    seen, errors = {{}}, {{}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for module, names in {names!r}.items():
            try:
                m = importlib.import_module(module)
                seen[module] = {{n: getattr(m, n).source for n in names}}
            except ImportError as e:
                errors[module] = str(e)
    print(json.dumps({{"seen": seen, "errors": sorted(errors),
                      "future_warnings": [str(w.message) for w in caught if w.category is FutureWarning]}}))
"""


def _v2_names():
    return {m: n for m, n in colossalchat_head.exported_names().items() if not m.startswith("coati.ray")}


@pytest.mark.slow
@pytest.mark.parametrize("broken", [(), ("coati.trainer.base",)])
def test_colossalchat_modules_import_exactly_as_without_coati_relay(tmp_path, broken):
    """Every module and name of a ColossalChat-HEAD-shaped coati: the same objects with and without the finder
    (V2's coati.ray excepted: it cannot be imported at HEAD), and no deprecation warning for any of them.

    With a V2 module that fails to import, what fails without the finder fails with it too (its names raise the
    original error), except V2 modules *under* the failed package, which the finder lets import."""
    root = colossalchat_head.write(tmp_path, broken=broken)
    without = run_isolated(IMPORT_ALL.format(with_relay=False, names=_v2_names()), extra_path=(str(root),))
    with_relay = run_isolated(IMPORT_ALL.format(with_relay=True, names=_v2_names()), extra_path=(str(root),))
    assert with_relay["future_warnings"] == []
    if not broken:
        assert with_relay["seen"] == without["seen"] and with_relay["errors"] == without["errors"] == []
        assert len(without["seen"]) >= 40
        return
    assert without["seen"].items() <= with_relay["seen"].items()
    assert with_relay["errors"] == ["coati.trainer", "coati.trainer.base"]
    assert set(with_relay["errors"]) <= set(without["errors"])
    assert set(with_relay["seen"]) - set(without["seen"]) == {
        "coati.trainer.callbacks", "coati.trainer.callbacks.base", "coati.trainer.callbacks.performance_evaluator",
        "coati.trainer.dpo", "coati.trainer.grpo", "coati.trainer.kto", "coati.trainer.orpo", "coati.trainer.ppo",
        "coati.trainer.rm", "coati.trainer.sft", "coati.trainer.utils"}


LEGACY_BESIDE_V2 = """
    import json, os, sys, warnings
    import coati_compat.imports.finder
    coati_compat.imports.finder.install()
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from coati.ray.detached_trainer_ppo import DetachedPPOTrainer
        from coati.ray.utils import get_receivers_per_sender
        from coati.trainer.strategies import DDPStrategy, NaiveStrategy
        from coati.models.gpt import GPTActor
        from coati.replay_buffer import NaiveReplayBuffer
        from coati.models import Actor, LoRAModule
        from coati.models.utils import normalize
        from coati.models.loss import GPTLMLoss, PolicyLoss
        from coati.experience_maker import Experience
        from coati.models import DpoLoss
        import coati.ray.utils
    for name, obj in [("DetachedPPOTrainer", DetachedPPOTrainer), ("DDPStrategy", DDPStrategy),
                      ("GPTActor", GPTActor), ("NaiveReplayBuffer", NaiveReplayBuffer), ("Actor", Actor),
                      ("LoRAModule", LoRAModule), ("normalize", normalize), ("GPTLMLoss", GPTLMLoss),
                      ("PolicyLoss", PolicyLoss), ("Experience", Experience), ("DpoLoss", DpoLoss)]:
        out[name] = getattr(obj, "source", None) or obj.__module__.split(".")[0]
    out["receivers"] = get_receivers_per_sender(0, 2, 4, False)
    out["warned"] = sorted({str(w.message).split(" is deprecated")[0] for w in caught
                            if w.category is FutureWarning})
    print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("legacy_names", ["", "1"])
def test_legacy_paths_and_names_beside_colossalchat(tmp_path, monkeypatch, legacy_names):
    """Legacy-only paths are served and legacy-only names are added to V2's modules (each warns); a name both
    define stays V2's unless COATI_RELAY_LEGACY_NAMES=1."""
    root = colossalchat_head.write(tmp_path)
    monkeypatch.setenv("COATI_RELAY_LEGACY_NAMES", legacy_names)
    out = run_isolated(LEGACY_BESIDE_V2, extra_path=(str(root),))
    for name in ("DetachedPPOTrainer", "DDPStrategy", "GPTActor", "NaiveReplayBuffer", "Actor", "LoRAModule",
                 "normalize"):
        assert out[name] == "coati_compat", name
    assert out["DpoLoss"] == "coati.models.loss"  # V2-only names stay V2's either way
    shared = {"GPTLMLoss": "coati.models.loss", "PolicyLoss": "coati.models.loss",
              "Experience": "coati.experience_maker.base"}
    for name, v2_source in shared.items():
        assert out[name] == ("coati_compat" if legacy_names else v2_source), name
    assert out["receivers"] == [0, 2]
    assert ("coati.models" if legacy_names else "coati.models.Actor") in out["warned"]
    assert "coati.ray.detached_trainer_ppo" in out["warned"]
    assert "coati.models.gpt" in out["warned"] and "coati.replay_buffer" in out["warned"]


@pytest.mark.slow
def test_legacy_paths_under_a_colossalchat_package_that_fails_to_import(tmp_path):
    root = colossalchat_head.write(tmp_path, broken=("coati.trainer",))
    out = run_isolated("""
        import json, warnings
        import coati_compat.imports.finder
        coati_compat.imports.finder.install()
        warnings.simplefilter("ignore", FutureWarning)
        from coati.trainer.strategies import DDPStrategy
        try:
            from coati.trainer import SFTTrainer
            error = None
        except ImportError as e:
            error = str(e)
        print(json.dumps({"strategy": DDPStrategy.__module__, "error": error}))
    """, extra_path=(str(root),))
    assert out["strategy"] == "coati_compat.legacy.strategies"
    assert "SFTTrainer" in out["error"] and "needs a package this host lacks" in out["error"]


@pytest.mark.slow
def test_a_colossalchat_missing_its_own_dependency_is_named_with_the_fix(tmp_path):
    """ColossalChat installed without loralib: its coati.models.lora fails, and with it its coati.models (which
    imports LoraConfig from there). The warnings and the error for a ColossalChat name name loralib, as
    ColossalChat's, with the pip command, not a name of the legacy layer; the legacy names are still served."""
    import importlib.util

    assert importlib.util.find_spec("loralib") is None, "this test needs a host without loralib"
    root = colossalchat_head.write(tmp_path, needs={"coati.models.lora": "loralib"})
    out = run_isolated("""
        import json, logging, warnings
        records = []
        handler = logging.Handler()
        handler.emit = lambda record: records.append(record.getMessage())
        logging.getLogger("coati_compat.imports.finder").addHandler(handler)
        import coati_compat.imports.finder
        coati_compat.imports.finder.install()
        warnings.simplefilter("ignore", FutureWarning)
        try:
            from coati.models import disable_dropout
            error = None
        except ImportError as e:
            error = str(e)
        from coati.models import Actor
        from coati.models.gpt import GPTActor
        print(json.dumps({"error": error, "warnings": records, "legacy": [Actor.__module__, GPTActor.__module__]}))
    """, extra_path=(str(root),))
    error = out["error"]
    assert error is not None and "'disable_dropout'" in error and "'coati.models'" in error, error
    assert "ColossalChat needs the package 'loralib'" in error and "pip install loralib" in error, error
    assert "coati_compat" not in error, error
    assert len(out["warnings"]) == 2, out["warnings"]  # coati.models.lora, then coati.models because of it
    assert all("'loralib'" in w and "pip install loralib" in w for w in out["warnings"]), out["warnings"]
    assert out["legacy"] == ["coati_compat.legacy.model_base", "coati_compat.legacy.model_families"]
