"""The command lines of both sides of a comparison.

The legacy side is the script unchanged under `coati_compat.compare.legacy_launch`. The migrated side is the
rewriter's script with the same arguments, plus ``--run_dir`` (where its ``metrics.jsonl`` goes) and
``--num_episodes``: enough passes over the prompt file for the step budget (a pass is ``prompts //
(inference_batch_size * num_producers)`` rounds, read from the script's own ``launch_kwargs``).
"""
from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

RESERVED_MIGRATED_FLAGS = ("--num_episodes", "--run_dir")


def legacy_command(script: Path, args: Sequence[str]) -> List[str]:
    return [sys.executable, "-m", "coati_compat.compare.legacy_launch", str(script), *args]


def count_prompts(path: Path) -> int:
    """Prompts in a ``.csv`` (rows under the header) or ``.jsonl`` (non-empty lines) file."""
    if not path.is_file():
        raise ValueError(f"the prompt file {path} does not exist")
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            return max(sum(1 for _ in csv.reader(f)) - 1, 0)
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def launch_kwargs_of(migrated: Path, args: Sequence[str]) -> Dict[str, Any]:
    """``launch_kwargs(build_parser().parse_args(args))`` of a migrated script (cheap: it imports no engine)."""
    spec = importlib.util.spec_from_file_location(f"coati_compare_{migrated.stem}", migrated)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a hand-edited migrated script may not import; say so and run the legacy side alone
        raise ValueError(f"the migrated script {migrated} does not import: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, "build_parser") or not hasattr(module, "launch_kwargs"):
        raise ValueError(f"{migrated} has no build_parser/launch_kwargs; is it the rewriter's output?")
    try:
        namespace = module.build_parser().parse_args(list(args))
    except SystemExit as exc:
        raise ValueError(f"the migrated script does not take the arguments {' '.join(args)} (argparse exit "
                         f"{exc.code}; its log shows why)") from None
    try:
        return module.launch_kwargs(namespace)
    except Exception as exc:  # the migrated script's own check of its arguments; its message says what to change
        raise ValueError(f"the migrated script refuses these arguments: {type(exc).__name__}: {exc}") from exc


def migrated_command(migrated: Path, args: Sequence[str], extra: Sequence[str], run_dir: Path,
                     steps: int, cwd: Path) -> Tuple[List[str], Dict[str, Any]]:
    """The migrated side's command line for ``steps`` steps and the ``launch_distributed`` keywords it will use;
    ValueError when it cannot be built."""
    clash = [a for a in extra if a.split("=")[0] in RESERVED_MIGRATED_FLAGS]
    if clash:
        raise ValueError(f"--migrated-args must not set {', '.join(clash)}: compare sets the run length and the "
                         "run directory itself")
    kwargs = launch_kwargs_of(migrated, [*args, *extra])
    prompts = count_prompts(cwd / Path(kwargs["train_dataset_config"]["path"]))
    per_round = int(kwargs["inference_batch_size"]) * int(kwargs["num_producers"])
    rounds = prompts // per_round
    if rounds < 1:
        raise ValueError(f"the prompt file holds {prompts} prompt(s), fewer than one round of the migrated run "
                         f"({per_round} = inference_batch_size x num_producers); give it more prompts")
    episodes = math.ceil(steps / rounds)
    command = [sys.executable, str(migrated), *args, *extra, "--num_episodes", str(episodes), "--run_dir",
               str(run_dir)]
    return command, kwargs
