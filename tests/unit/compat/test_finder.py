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

import pytest

from coati_compat import finder, install_pth

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
    subprocess.run([sys.executable, "-m", "coati_compat.install_pth", "--site-dir", str(site_dir)], check=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(SRC_ROOTS)}, timeout=60)
    assert (site_dir / install_pth.PTH_NAME).is_file()
    out = run_isolated(f"""
        import importlib, json, site, sys, warnings
        before = "coati_compat.finder" in sys.modules
        site.addsitedir({str(site_dir)!r})
        after_startup = {{"finder": "coati_compat.finder" in sys.modules, "torch": "torch" in sys.modules}}
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


@pytest.mark.slow
def test_beside_a_colossalchat_coati_package(tmp_path):
    fake = tmp_path / "colossalchat"
    files = {
        "coati/__init__.py": "raise ImportError('the ColossalChat coati/__init__.py must not run')\n",
        "coati/distributed/__init__.py": "SOURCE = 'colossalchat'\n",
        "coati/distributed/launch.py": "from coati.distributed import SOURCE\ndef launch_distributed(): return SOURCE\n",
        "coati/ray/__init__.py": "raise ImportError('broken ColossalChat coati.ray')\n",
        "coati/ray/utils.py": "raise ImportError('broken ColossalChat coati.ray.utils')\n",
        "coati/models/__init__.py": "raise ImportError('ColossalChat V2 coati.models')\n",
        "coati/models/v2_extra.py": "SOURCE = 'colossalchat'\n",
    }
    for rel, text in files.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    out = run_isolated("""
        import json, sys, warnings
        import coati_compat.finder
        coati_compat.finder.install()
        warnings.simplefilter("ignore", FutureWarning)
        import coati.distributed.launch
        import coati.models.v2_extra
        import coati.ray.utils
        import coati_compat.legacy.ray_utils as ours
        print(json.dumps({
            "distributed": coati.distributed.launch.launch_distributed(),
            "distributed_file": coati.distributed.__file__,
            "v2_extra": coati.models.v2_extra.SOURCE,
            "ray_utils_is_ours": coati.ray.utils is ours,
            "ray_utils_file": coati.ray.utils.__file__,
            "coati_path": list(coati.__path__),
        }))
    """, extra_path=(str(fake),))
    assert out["distributed"] == "colossalchat"
    assert out["distributed_file"].startswith(str(fake))
    assert out["v2_extra"] == "colossalchat"
    assert out["ray_utils_is_ours"] is True
    assert out["ray_utils_file"].startswith(str(REPO / "compat"))
    assert out["coati_path"] == [str(fake / "coati")]
