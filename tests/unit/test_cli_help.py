"""`coati-relay --help`, every subcommand's ``--help`` and ``--version`` as a user runs them: each a process of its own
that imports none of the heavy packages (the subcommands import their implementation when they run), and help text
for every argument."""
from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

HEAVY = {"torch", "transformers", "ray", "vllm", "colossalai", "peft"}
SUBCOMMANDS = ["run", "plot", "export", "docs", "migrate", "legacy-run", "compare", "demo"]


def _command():
    script = Path(sys.executable).with_name("coati-relay")
    return [sys.executable, "-X", "importtime"] + ([str(script)] if script.is_file() else ["-m", "coati_relay.cli"])


def _run(*args):
    done = subprocess.run([*_command(), *args], capture_output=True, text=True, timeout=120)
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    return done, imported


def test_top_level_help_lists_every_subcommand_and_imports_nothing_heavy():
    done, imported = _run("--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "coati_relay" in imported, "importtime saw the command's own imports"
    assert not imported & HEAVY, f"--help imported {sorted(imported & HEAVY)}"
    for name in SUBCOMMANDS:
        assert f"\n    {name}" in done.stdout, f"{name} missing from --help:\n{done.stdout}"


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help_imports_nothing_heavy(name):
    done, imported = _run(name, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout and name in done.stdout.split("\n", 1)[0] + done.stdout
    assert not imported & HEAVY, f"{name} --help imported {sorted(imported & HEAVY)}"


def test_version_comes_from_the_package_metadata():
    done, imported = _run("--version")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"coati-relay {version('coati-relay')}"
    assert not imported & HEAVY


def test_every_argument_has_help_text():
    from coati_relay.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == set(SUBCOMMANDS)
    parsers = {"coati-relay": parser, **{n: p for n, p in subparsers.choices.items() if n != "demo"}}
    for name, p in parsers.items():
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(c.help for c in action._choices_actions), f"{name}: a subcommand has no help"
                continue
            assert action.help and action.help != argparse.SUPPRESS, f"{name}: {action.option_strings or action.dest}"
    from coati_relay.demo import main as demo_main

    with pytest.raises(SystemExit) as done:  # demo parses its own arguments: its --help lists each with its text
        demo_main(["--help"])
    assert done.value.code == 0
