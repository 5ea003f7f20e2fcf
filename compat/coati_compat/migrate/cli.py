"""The command line of the rewriter: ``python -m coati_compat.migrate`` (and ``coati-relay migrate``).

Exit status: 0 the script was translated; 3 it was written, but parts could not be translated (listed on
stderr, and as ``NOT TRANSLATED`` NOTEs in the output); 2 bad input (missing file, not Python, no legacy actors,
flags the script does not take).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

EXIT_OK, EXIT_BAD_INPUT, EXIT_PARTIAL = 0, 2, 3
PROG = "python -m coati_compat.migrate"
DESCRIPTION = "Rewrite a legacy coati.ray launch script into a coati_relay.launch_distributed script."


def _flag_pairs(pairs: List[str]) -> dict:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--set takes FLAG=VALUE (a flag of the legacy script without its dashes, e.g. "
                             f"--set pretrain=/models/actor), got {pair!r}")
        out[name.lstrip("-")] = value
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("legacy_script", help="the legacy launch script (read, never run)")
    parser.add_argument("-o", "--output", default=None,
                        help="write the migrated script to this file, or into this directory under the legacy "
                        "script's name (default: stdout)")
    parser.add_argument("--target", default="coati_relay", choices=["coati_relay", "colossalchat"],
                        help="whose launch_distributed the call is written for: coati_relay (this engine, PPO "
                        "included; the default) or colossalchat (ColossalChat's coati.distributed: the GRPO family, "
                        "rule-based rewards, JSONL prompts; runs on coati-relay too)")
    parser.add_argument("--yaml", default=None, help="also write a YAML config for `coati-relay run` here "
                        "(target coati_relay only)")
    parser.add_argument("--set", action="append", default=[], metavar="FLAG=VALUE",
                        help="a legacy flag's value for the YAML (repeatable), e.g. --set pretrain=/models/actor")


def run(args: argparse.Namespace) -> int:
    from coati_compat.migrate.rewrite import migrate_file

    source = Path(args.legacy_script)
    if args.output and Path(args.output).is_dir():
        args.output = str(Path(args.output) / source.name)
    for out in (args.output, args.yaml):
        if out is not None and source.exists() and Path(out).resolve() == source.resolve():
            print(f"migrate: refusing to overwrite the legacy script {source}; choose another output path",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        if args.yaml and args.target != "coati_relay":
            raise ValueError(f"--yaml writes a config for `coati-relay run` and goes with --target coati_relay; "
                             f"with --target {args.target}, run the migrated script itself")
        migration = migrate_file(source, target=args.target, command=args.rewriter_command)
        yaml_text = migration.yaml(_flag_pairs(args.set)) if args.yaml else None
    except (FileNotFoundError, ValueError) as exc:
        print(f"migrate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.output:
        Path(args.output).write_text(migration.script, encoding="utf-8")
    else:
        sys.stdout.write(migration.script)
    if yaml_text is not None:
        Path(args.yaml).write_text(yaml_text, encoding="utf-8")
    where = f" -> {args.output}" if args.output else ""
    print(f"migrate: {source.name}{where}: {len(migration.notes)} NOTE(s) on settings without an exact "
          f"counterpart", file=sys.stderr)
    if migration.untranslated:
        print("migrate: NOT TRANSLATED (needs hand work):", file=sys.stderr)
        for text in migration.untranslated:
            print(f"  - {text}", file=sys.stderr)
        return EXIT_PARTIAL
    return EXIT_OK


def add_subcommand(subparsers) -> None:
    """Adds ``migrate`` to an argparse sub-command set whose parsed arguments run ``args.fn(args)``."""
    parser = subparsers.add_parser("migrate", help=DESCRIPTION, description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(fn=run, rewriter_command="coati-relay migrate")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(rewriter_command=PROG)
    return run(parser.parse_args(argv))
