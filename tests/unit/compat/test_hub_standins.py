"""``python -m coati_compat.hub_standins``: the tokenizers and hub datasets it writes load by hub name offline, in a
fresh process that only has the cache variables and the offline switches."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from coati_compat import hub_standins

# Run in the child: every stand-in by hub name, in the call forms of the legacy scripts and tests.
CHILD = """
import json
from datasets import load_dataset
from transformers import AutoTokenizer

out = {"tokenizers": {n: len(AutoTokenizer.from_pretrained(n)) for n in %r}}
hh = load_dataset("Anthropic/hh-rlhf", data_dir="harmless-base")
out["hh-rlhf"] = {s: [len(hh[s]), hh[s].column_names] for s in hh}
out["hh-rlhf others"] = [len(load_dataset("Anthropic/hh-rlhf", data_dir=d)["test"]) for d in (None, "helpful-base")]
rm = load_dataset("Dahoas/rm-static")
out["rm-static"] = {s: [len(rm[s]), rm[s].column_names] for s in rm}
si = load_dataset("yizhongw/self_instruct", "super_natural_instructions", split="test")
out["self_instruct"] = [len(si), si.column_names, si[0]["completion"]]
print(json.dumps(out))
"""


def test_standins_load_by_hub_name_offline(tmp_path):
    assert hub_standins.main([str(tmp_path / "hub"), "--datasets-cache", str(tmp_path / "datasets")]) == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_DATASETS_CACHE=str(tmp_path / "datasets"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", CHILD % (list(hub_standins.STANDINS),)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tokenizers"] == {name: len(make()) for name, make in hub_standins.STANDINS.items()}
    rows = hub_standins.DATASET_ROWS
    assert out["hh-rlhf"] == {s: [rows, ["chosen", "rejected"]] for s in ("train", "test")}
    assert out["hh-rlhf others"] == [rows, rows]
    assert out["rm-static"] == {s: [rows, ["prompt", "response", "chosen", "rejected"]] for s in ("train", "test")}
    assert out["self_instruct"][:2] == [rows, ["prompt", "completion"]]
    assert out["self_instruct"][2] == f" {rows} plus {rows + 1} is {2 * rows + 1}."  # test split follows train


def test_dataset_entry_holding_another_version_is_left_alone_unless_forced(tmp_path):
    written = hub_standins.write_dataset_standin(tmp_path, "Dahoas/rm-static")
    assert hub_standins.write_dataset_standin(tmp_path, "Dahoas/rm-static") == written  # its own: rewritten
    download = written.parents[1] / "1.0.0" / ("0" * 16)
    download.mkdir(parents=True)  # as if really downloaded
    assert hub_standins.write_dataset_standin(tmp_path, "Dahoas/rm-static") is None and download.exists()
    assert hub_standins.write_dataset_standin(tmp_path, "Dahoas/rm-static", force=True) == written
    assert not download.exists()
