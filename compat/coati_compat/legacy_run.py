"""``coati-relay legacy-run SCRIPT [ARGS...]``: runs a GPU-era Ray script unchanged in CPU mode
(`coati_compat.cpu_mode`), as ``python SCRIPT ARGS...`` would with ``COATI_RELAY_CPU_MODE=1`` set."""
from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import List

from coati_compat.cpu_mode import patches as cpu_mode

DESCRIPTION = ("run a GPU-era Ray script (num_gpus actors, GPU bundles, .cuda(), NCCL) unchanged on CPUs, for smoke "
               f"tests ({cpu_mode.ENV}=1 in this process and every Ray worker it starts)")


def check_inputs(script: str) -> Path:
    """The script's path; ValueError when it is no file or ``$COATI_RELAY_CPU_MODE_GPUS`` is bad."""
    path = Path(script)
    if not path.is_file():
        raise ValueError(f"legacy-run: {script} is not a file; pass the path of the Python script to run")
    cpu_mode.logical_gpus()
    return path


def run_script(script: str, args: List[str]) -> int:
    """Runs ``script`` as ``__main__`` with ``args`` in this process, CPU mode on; returns its exit status (the
    script's own exceptions propagate, as under ``python SCRIPT``). Bad input raises ValueError before it starts."""
    path = check_inputs(script)
    os.environ[cpu_mode.ENV] = "1"  # inherited by the local Ray cluster this script starts, hence by its workers
    cpu_mode.install()
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _run(args: argparse.Namespace) -> int:
    try:
        check_inputs(args.script)
    except ValueError as exc:
        print(f"coati-relay {exc}", file=sys.stderr)
        return 2
    return run_script(args.script, args.script_args)


def add_subcommand(subparsers) -> None:
    """Adds ``legacy-run`` to an argparse sub-command set whose parsed arguments run ``args.fn(args)``."""
    parser = subparsers.add_parser("legacy-run", help=DESCRIPTION, description=DESCRIPTION)
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments, passed on unchanged")
    parser.set_defaults(fn=_run)
