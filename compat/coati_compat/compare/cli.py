"""``coati-relay compare LEGACY.py [--steps N] [--out DIR] -- ARGS...``: a legacy script and its migration, run with
the same arguments and step budget, side by side.

1. The legacy script runs unchanged ``--legacy-runs`` times (default 2: their spread is the noise of the verdicts),
   in CPU mode on a host without CUDA, recording through the shims' callbacks and the legacy functions.
2. ``coati-relay migrate`` rewrites it; the rewritten script runs once with the same arguments (plus the run
   length and run directory), recording through the engine's ``metrics.jsonl``. Exit 3 of the rewriter (parts it
   could not translate) still writes a complete script: it runs, and the report lists what was not translated.
   When the rewriter writes nothing (bad input), or the migrated script cannot be started, the legacy side runs
   alone.
3. The report goes to DIR: ``report.md``, ``compare.json``, ``compare.png``; with ``--tensorboard TB_DIR`` also
   each side as a TensorBoard run (``TB_DIR/legacy-N``, ``TB_DIR/migrated``).

Exit status: 0 both sides ran; 1 a side failed or did not run (the report says why); 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
    from coati_compat.compare.explanations import Explanation

# The parts of the comparison are imported where they run: `coati-relay --help` builds this subcommand's parser.

logger = logging.getLogger(__name__)

DESCRIPTION = ("run a legacy coati.ray script unchanged and its migration (coati-relay migrate) with the same "
               "arguments, side by side; report per-step numbers and a verdict per quantity")
USAGE = "coati-relay compare LEGACY.py [--steps N] [--out DIR] [options] -- SCRIPT_ARGS..."
DEFAULT_STEPS = 20


class BadInput(ValueError):
    """Input the command refuses, with what to do instead."""


def _positive(kind: type, what: str):
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be a positive {kind.__name__}, got {text!r}")
        return value

    return parse


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=_positive(int, "--steps"), default=DEFAULT_STEPS,
                        help=f"steps (weight versions) each side makes at most (default {DEFAULT_STEPS})")
    parser.add_argument("--out", default=None, help="report directory (default: compare-<script name>)")
    parser.add_argument("--legacy-runs", type=_positive(int, "--legacy-runs"), default=2,
                        help="runs of the legacy script; their spread is the noise of the verdicts (default 2)")
    parser.add_argument("--reuse-legacy", default=None, metavar="DIR",
                        help="take the legacy runs from an earlier report in DIR (same script, arguments, steps)")
    parser.add_argument("--migrated-args", default="", metavar="'ARGS'",
                        help="extra arguments for the migrated side only, quoted (e.g. --migrated-args='--lr 1e-5')")
    parser.add_argument("--timeout", type=_positive(float, "--timeout"), default=3600.0,
                        help="seconds one run may take (default 3600)")
    parser.add_argument("--tensorboard", default=None, metavar="TB_DIR",
                        help="also write each side as a TensorBoard run: TB_DIR/legacy-N and TB_DIR/migrated")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coati-relay compare", usage=USAGE, description=DESCRIPTION)
    parser.add_argument("legacy_script", help="the legacy script (run unchanged)")
    add_options(parser)
    return parser


class _Help(argparse.Action):
    """``coati-relay compare --help``: the help of the command's own options."""

    def __init__(self, option_strings: List[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show this help")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        _parser().print_help()
        parser.exit()


def parse(words: List[str]) -> argparse.Namespace:
    """``LEGACY.py [options] -- ARGS``: the options before ``--``, the script's arguments after it."""
    parser = _parser()
    if "--" not in words and ("-h" in words or "--help" in words):
        parser.parse_args(["--help"])
    if "--" not in words:
        raise BadInput("put the legacy script's arguments after --, e.g. `coati-relay compare train.py --steps 5 "
                       "-- --pretrain MODEL`; a script without arguments ends with --")
    cut = words.index("--")
    args = parser.parse_args(words[:cut])
    args.script_args = words[cut + 1:]
    return args


def _check(args: argparse.Namespace) -> Path:
    script = Path(args.legacy_script)
    if not script.is_file():
        raise BadInput(f"{args.legacy_script} is not a file; pass the path of the legacy script")
    if args.reuse_legacy and not (Path(args.reuse_legacy) / "compare.json").is_file():
        raise BadInput(f"--reuse-legacy {args.reuse_legacy}: no compare.json there; pass the directory of an "
                       "earlier report")
    if args.tensorboard:
        from coati_compat.compare import tensorboard_runs

        try:
            tensorboard_runs.check_available()
        except ImportError as exc:
            raise BadInput(str(exc)) from None
    return script.resolve()


def out_dir(args: argparse.Namespace) -> Path:
    """``--out``, or ``compare-<script name>``."""
    return Path(args.out or f"compare-{Path(args.legacy_script).stem}")


def _host_has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _reused_legacy(args: argparse.Namespace, script: Path) -> List[Dict[str, Any]]:
    earlier = json.loads((Path(args.reuse_legacy) / "compare.json").read_text(encoding="utf-8"))
    same = (earlier["script"], earlier["args"], earlier["steps_budget"]) == (str(script), args.script_args,
                                                                               args.steps)
    if not same:
        raise BadInput(f"--reuse-legacy {args.reuse_legacy}: that report ran {earlier['script']} with "
                       f"{earlier['args']} for {earlier['steps_budget']} steps; compare runs the same script, "
                       "arguments and --steps only")
    return earlier["legacy"]


def run_legacy(script: Path, args: argparse.Namespace, out: Path) -> List[Dict[str, Any]]:
    from coati_compat.compare import recording_switch, side_commands, sides, steps

    runs = []
    for i in range(1, args.legacy_runs + 1):
        shutil.rmtree(out / f"legacy-{i}", ignore_errors=True)  # an earlier report's records must not mix in
        events = out / f"legacy-{i}" / "events"
        events.mkdir(parents=True)
        env = sides.side_env({**recording_switch.recording_env(str(events)),
                              "RAY_NAMESPACE": f"compare-{uuid.uuid4().hex[:8]}"})
        run = sides.run_side(side_commands.legacy_command(script, args.script_args), env, Path.cwd(),
                             out / f"legacy-{i}" / "log.txt", lambda: len(steps.legacy_rows(events, finished=False)),
                             args.steps, args.timeout)
        ended = run.stopped_at is None and not run.timed_out  # else its last step may be cut short
        rows = steps.legacy_rows(events, finished=ended)[:args.steps]
        runs.append({"run": run.to_json(), "rows": rows,
                     "summary": steps.summarize(rows, run.wall_s, run.total_peak_memory_mib)})
        logger.info("compare: legacy run %d: %d step(s) in %.0f s", i, len(rows), run.wall_s)
    return runs


def run_migrated(migrated: Path, args: argparse.Namespace, out: Path, budget: int) -> Dict[str, Any]:
    from coati_compat.compare import explanations, side_commands, sides, steps

    shutil.rmtree(out / "migrated", ignore_errors=True)  # the engine would continue an earlier metrics file
    run_dir = out / "migrated" / "run"
    command, kwargs = side_commands.migrated_command(migrated, args.script_args, shlex.split(args.migrated_args),
                                                     run_dir, budget, Path.cwd())
    run = sides.run_side(command, sides.side_env({}), Path.cwd(), out / "migrated" / "log.txt",
                         lambda: len(steps.migrated_rows(run_dir)), budget, args.timeout)
    rows = steps.migrated_rows(run_dir)[:budget]
    logger.info("compare: migrated run: %d step(s) in %.0f s", len(rows), run.wall_s)
    return {"run": run.to_json(), "rows": rows, "idle_topics": explanations.idle_topics(kwargs),
            "summary": steps.summarize(rows, run.wall_s, run.total_peak_memory_mib)}


def rewrite(script: Path, out: Path) -> Dict[str, Any]:
    """The rewriter's result: its exit code (0, 3, or 2 when it wrote nothing), NOTEs and untranslated parts."""
    from coati_compat.migrate.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_PARTIAL
    from coati_compat.migrate.rewrite import migrate_file

    try:
        migration = migrate_file(script)
    except (FileNotFoundError, ValueError) as exc:
        return {"exit_code": EXIT_BAD_INPUT, "error": str(exc), "untranslated": [], "notes": [],
                "migrated_script": None}
    path = out / f"migrated_{script.name}"
    path.write_text(migration.script, encoding="utf-8")
    return {"exit_code": EXIT_PARTIAL if migration.untranslated else EXIT_OK, "error": None,
            "untranslated": list(migration.untranslated), "notes": migration.notes, "migrated_script": str(path)}


def _deviations(script: Path, args: argparse.Namespace, cuda: bool) -> List["Explanation"]:
    """The rows of the guide's deviations page that apply to this script (none, with a warning, where the guide is
    not beside the package, as in a non-editable install)."""
    from coati_compat.compare import explanations

    guide = Path(__file__).resolve().parents[3] / explanations.DEVIATIONS_PAGE
    if not guide.is_file():
        logger.warning("compare: %s not found; the report lists the rewriter's NOTEs only", guide)
        return []
    facts = explanations.script_facts(script.read_text(encoding="utf-8"), args.script_args, cuda,
                                      keep_half=bool(os.environ.get("COATI_RELAY_KEEP_HALF_ON_CPU")))
    return explanations.deviation_explanations(guide.read_text(encoding="utf-8"), facts)


def compare(args: argparse.Namespace) -> Dict[str, Any]:
    """Runs both sides and writes the report; returns the comparison (what ``compare.json`` holds)."""
    from coati_compat.compare import explanations, report, tensorboard_runs, verdicts

    script = _check(args)
    legacy = _reused_legacy(args, script) if args.reuse_legacy else None
    out = out_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    rewritten = rewrite(script, out)
    cuda = _host_has_cuda()
    if legacy is None:
        legacy = run_legacy(script, args, out)
    migrated, skipped = None, None
    if rewritten["migrated_script"] is None:
        skipped = f"the rewriter wrote no script: {rewritten['error']}"
    else:
        budget = max((len(run["rows"]) for run in legacy), default=0) or args.steps
        try:
            migrated = run_migrated(Path(rewritten["migrated_script"]), args, out, budget)
        except ValueError as exc:
            skipped = f"{exc}."
    found = _deviations(script, args, cuda) + explanations.note_explanations(
        rewritten.pop("notes"), migrated["idle_topics"] if migrated else ())
    judged = verdicts.judge([r["rows"] for r in legacy], [r["summary"] for r in legacy],
                            migrated["rows"] if migrated else [], migrated["summary"] if migrated else {})
    comparison = {"script": str(script), "args": list(args.script_args), "steps_budget": args.steps, "cuda": cuda,
                  "migrated_args": shlex.split(args.migrated_args), "rewriter": rewritten, "legacy": legacy,
                  "migrated": migrated, "migrated_skipped": skipped, "rule": verdicts.RULE,
                  "verdicts": [v.to_json() for v in judged], "explanations": [e.to_json() for e in found]}
    report.write_report(out, comparison)
    if args.tensorboard:
        tensorboard_runs.write_runs(comparison, Path(args.tensorboard))
    return comparison


def _run(args: argparse.Namespace) -> int:
    try:
        options = parse(args.words)
        comparison = compare(options)
    except BadInput as exc:
        print(f"coati-relay compare: {exc}", file=sys.stderr)
        return 2
    out = out_dir(options)
    print((out / "report.md").read_text(encoding="utf-8"))
    print(f"report: {out / 'report.md'}, {out / 'compare.json'}, {out / 'compare.png'}")
    if options.tensorboard:
        print(f"TensorBoard runs: {options.tensorboard} (tensorboard --logdir {options.tensorboard})")
    ran = [r["run"] for r in comparison["legacy"]] + ([comparison["migrated"]["run"]] if comparison["migrated"]
                                                       else [])
    return 0 if comparison["migrated"] and all(r["ok"] for r in ran) else 1


def add_subcommand(subparsers) -> None:
    """Adds ``compare`` to an argparse sub-command set whose parsed arguments run ``args.fn(args)``."""
    parser = subparsers.add_parser("compare", help=DESCRIPTION, description=DESCRIPTION, usage=USAGE,
                                   add_help=False)
    parser.add_argument("-h", "--help", action=_Help)
    parser.add_argument("words", nargs=argparse.REMAINDER, help="LEGACY.py [options] -- SCRIPT_ARGS...")
    parser.set_defaults(fn=_run)
