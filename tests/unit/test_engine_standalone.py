"""The engine (backend/coati_relay) imports and runs without the legacy package: a fresh interpreter without site
packages' .pth hooks, coati_compat blocked, imports every coati_relay module, builds a run config and runs the CLI."""
from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib, pkgutil, sys
sys.path[:0] = [BACKEND, SITE]
sys.modules["coati_compat"] = None  # import coati_compat raises ImportError
import coati_relay
names = [m.name for m in pkgutil.walk_packages(coati_relay.__path__, "coati_relay.")]
for name in names:
    importlib.import_module(name)
assert not [m for m in sys.modules if m.startswith(("coati_compat.", "coati."))], "legacy modules were imported"
from coati_relay.assembly.build import build_run_config
from coati_relay.toy import build_tiny_model, write_toy_dataset
model = str(build_tiny_model())
data = str(write_toy_dataset(TMP + "/prompts.jsonl", num_prompts=16))
cfg = build_run_config(
    num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1, inference_batch_size=4,
    inference_microbatch_size=2, train_batch_size=2, train_minibatch_size=2,
    train_dataset_config={"path": data, "max_length": 32, "system_prompt": ""}, inference_model_config={"path": model},
    generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0}, train_model_config={"path": model},
    grpo_config={"lr": 1e-3, "reward_fn_type": "toy_letter"},
    plugin_config={}, inference_backend="transformers", num_generations=4, core_algo="GRPO", run_dir=TMP + "/run")
from coati_relay.cli import main
try:
    main(["--help"])
except SystemExit as exc:
    assert exc.code == 0
print("imported", len(names), "modules;", cfg.core_algo)
"""


def test_engine_imports_and_runs_without_coati_compat(tmp_path):
    probe = (f"BACKEND = {str(ROOT / 'backend')!r}\nSITE = {sysconfig.get_paths()['purelib']!r}\n"
             f"TMP = {str(tmp_path)!r}\n" + PROBE)
    done = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "imported" in done.stdout and "GRPO" in done.stdout
    commands = set(re.findall(r"^    (\S+)", done.stdout.split("positional arguments")[1], flags=re.M))
    assert {"run", "demo"} <= commands and "migrate" not in commands, commands


def test_cli_lists_the_migrate_subcommand_of_coati_compat(capsys):
    from coati_relay.cli import main

    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "migrate" in capsys.readouterr().out.split("positional arguments")[1]
