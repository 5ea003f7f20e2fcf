"""The `coati-relay` command: ``run CONFIG.yaml``, ``plot RUN_DIR...``, ``export RUN_DIR OUT_DIR``, ``demo``, and the
subcommands other packages register under the entry-point group ``coati_relay.subcommands`` (``migrate``, from
coati_compat).

Building the parser imports no implementation: each subcommand imports its own when it runs, so ``--help`` of the
command and of every subcommand stays free of torch, transformers and Ray (a test checks). A registered subcommand's
module must keep to that too."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib.metadata import entry_points
from typing import List, Optional

SUBCOMMAND_GROUP = "coati_relay.subcommands"


RUN_EPILOG = """examples:
  coati-relay run grpo.yaml
  coati-relay run grpo.yaml --set grpo_config.lr=1e-5 --set num_episodes=3
  coati-relay run grpo.yaml --dry-run          # check; print the config run takes back, resolved values as comments
  coati-relay run grpo.yaml --import myrewards  # myrewards.py registers rewards with @register_reward
  coati-relay run grpo.yaml --set grpo_config.reward_fn=myrewards:exact  # a reward by import path

exit codes: 0 trained; 1 the run failed (a role died or timed out); 2 the config is wrong (the message says how);
  130 stopped by Ctrl-C or SIGTERM (the message names the checkpoint and the resume_from to continue)"""


PLOT_EPILOG = """examples:
  coati-relay plot runs/my-grpo                  # writes runs/my-grpo/metrics.png
  coati-relay plot runs/a runs/b -o compare.png  # both runs on one figure

exit codes: 0 written (the PNG's path is printed)"""

EXPORT_EPILOG = """examples:
  coati-relay export runs/my-grpo hf-model                             # latest checkpoint, merged weights
  coati-relay export runs/my-grpo/checkpoints/step-000020 hf-model --adapter   # LoRA adapters alone

exit codes: 0 written (the directory is printed); 2 the source or the output directory is wrong"""


class ConfigFileError(ValueError):
    """The config file is missing, unreadable or not a YAML mapping."""


def _read_config(path: str) -> dict:
    """The mapping of launch keywords in the YAML file ``path``; `ConfigFileError` where it cannot be read."""
    import yaml

    try:
        with open(path) as f:
            kwargs = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigFileError(f"{path}: no such file; give the path of a YAML file of launch_distributed "
                              f"keywords") from None
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigFileError(f"{path} is not valid YAML{at}: {problem}") from None
    if not isinstance(kwargs, dict):
        raise ConfigFileError(f"{path} must hold a mapping of launch_distributed keywords, got "
                              f"{type(kwargs).__name__}")
    return kwargs


def _import_user_modules(kwargs: dict, extra: List[str]) -> List[str]:
    """Imports the modules of the config's ``imports`` key (popped from ``kwargs``) and of ``--import``, from the
    current directory first, as ``python -m`` does, so that what they register is there before the config is
    built. Returns them, the key's first."""
    from coati_relay.config.import_paths import ImportPathError, import_user_module

    listed = kwargs.pop("imports", None) or []
    if isinstance(listed, str):
        listed = [listed]
    if not isinstance(listed, list):
        raise ImportPathError(f"imports must be a list of module names or .py files, got {listed!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for spec in [*listed, *extra]:
        import_user_module(spec)
    return [*listed, *extra]


def _dry_run_text(kwargs: dict, imports: List[str], cfg) -> str:
    """YAML that ``coati-relay run`` takes back: the keywords as read (the file's, after ``--set``; every module
    imported under ``imports``), then the resolved run config (defaults filled in) as comments."""
    import yaml

    from coati_relay.observe.trackers import run_config_dict

    keywords = {**kwargs, **({"imports": imports} if imports else {})}
    resolved = yaml.safe_dump(run_config_dict(cfg), sort_keys=False).splitlines()
    return (yaml.safe_dump(keywords, sort_keys=False)
            + "# resolved (defaults filled in, as the run uses them; not read back):\n"
            + "".join(f"#   {line}\n" for line in resolved))


def _run(args: argparse.Namespace) -> int:
    from coati_relay.assembly.build import ConfigError, build_run_config
    from coati_relay.config.import_paths import ImportPathError
    from coati_relay.config.overrides import OverrideError, apply_overrides
    from coati_relay.config.user_frame import config_file
    from coati_relay.launch import launch_distributed
    from coati_relay.observe.interrupt import RunInterrupted
    from coati_relay.observe.metrics import summary_table
    from coati_relay.observe.run_result import RunFailed

    try:
        kwargs = apply_overrides(_read_config(args.config), args.set)
        imports = _import_user_modules(kwargs, args.imports)
        with config_file(args.config):  # warnings about the config point at it
            if args.dry_run:
                print(_dry_run_text(kwargs, imports, build_run_config(**kwargs)), end="")
                return 0
            result = launch_distributed(**kwargs)
    except (ConfigError, ConfigFileError, ImportPathError, OverrideError, TypeError) as exc:
        print(f"coati-relay run: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"coati-relay run: the run failed: {exc}", file=sys.stderr)
        return 1
    except RunInterrupted as exc:
        again = f" (coati-relay run {args.config} --set resume_from={exc.resume_from})" if exc.resume_from else ""
        print(f"coati-relay run: {exc}{again}", file=sys.stderr)
        return 130
    print(summary_table([result.summary], list(result.summary)))
    print(f"run dir: {result.run_dir}; checkpoints: {result.checkpoints}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from coati_relay.observe.plotting import plot_run

    png = plot_run(args.run_dirs if len(args.run_dirs) > 1 else args.run_dirs[0], out_png=args.out)
    print(png)
    return 0


def _export(args: argparse.Namespace) -> int:
    from coati_relay.export import ExportError, export_checkpoint

    try:
        out = export_checkpoint(args.source, args.out_dir, adapter=args.adapter, model=args.model,
                                tokenizer=args.tokenizer, dtype=args.dtype)
    except ExportError as exc:
        print(f"coati-relay export: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def _docs(args: argparse.Namespace) -> int:
    from coati_relay.migration import guide

    try:
        sys.stdout.write(guide.read(args.topic) if args.topic else guide.index())
    except (FileNotFoundError, ValueError) as exc:
        print(f"docs: {exc}", file=sys.stderr)
        return 2
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("coati-relay")
    except PackageNotFoundError:
        return "unknown (the coati-relay package is not installed)"


def add_registered_subcommands(sub: argparse._SubParsersAction) -> None:
    """Calls each ``coati_relay.subcommands`` entry point with ``sub``; one whose package is not importable (the
    engine installed without coati_compat) is left out."""
    for entry in entry_points(group=SUBCOMMAND_GROUP):
        try:
            add = entry.load()
        except ImportError:
            continue
        add(sub)


def build_parser() -> argparse.ArgumentParser:
    """The command's parser, every subcommand's included (``demo`` parses its own arguments)."""
    parser = argparse.ArgumentParser(prog="coati-relay", description="Train with GRPO/PPO on the coati-relay engine, "
                                     "and run or migrate legacy coati.ray scripts.")
    parser.add_argument("--version", action="version", version=f"coati-relay {_version()}",
                        help="print the installed coati-relay version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_run = sub.add_parser("run", help="launch_distributed with the keywords of a YAML file",
                           description="Run launch_distributed with the keywords of a YAML file.", epilog=RUN_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p_run.add_argument("config", help="YAML file holding a mapping of launch_distributed keywords")
    p_run.add_argument("--set", action="append", default=[], metavar="KEY.SUB=VALUE",
                       help="override one keyword or one key of a section (the value read as YAML); repeatable")
    p_run.add_argument("--import", action="append", default=[], dest="imports", metavar="MODULE_OR_FILE",
                       help="import a module (or a .py file) first, for the rewards, losses and estimators it "
                       "registers; repeatable (the YAML key `imports: [...]` does the same)")
    p_run.add_argument("--dry-run", action="store_true",
                       help="check the config and print it as YAML that run takes back (after --set; every "
                       "--import under imports), with the resolved config as comments; start nothing")
    p_run.set_defaults(fn=_run)
    p_plot = sub.add_parser("plot", help="PNG of reward and loss per step of one or more run dirs",
                            description="Draw reward and loss per step of one or more run directories.",
                            epilog=PLOT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p_plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run directory (holding metrics.jsonl)")
    p_plot.add_argument("-o", "--out", default=None, help="the PNG to write (default: metrics.png in the first run "
                        "directory, metrics_compare.png for several)")
    p_plot.set_defaults(fn=_plot)
    p_export = sub.add_parser("export", help="a run's trained policy as a Hugging Face model directory",
                              epilog=EXPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Write the policy of a run's latest checkpoint (or of one checkpoint) as a "
                              "save_pretrained directory: config.json, safetensors weights and the tokenizer. A LoRA "
                              "run exports merged weights unless --adapter.")
    p_export.add_argument("source", metavar="RUN_DIR_OR_CHECKPOINT",
                          help="a run directory (its latest checkpoint is taken) or one checkpoint "
                          "(RUN_DIR/checkpoints/step-NNNNNN)")
    p_export.add_argument("out_dir", metavar="OUT_DIR", help="directory to write (new, or empty)")
    p_export.add_argument("--adapter", action="store_true",
                          help="LoRA runs: write the adapters alone (peft's adapter_config.json and "
                          "adapter_model.safetensors) instead of merged weights")
    p_export.add_argument("--model", default=None, metavar="MODEL_DIR",
                          help="the model directory the run trained, for checkpoints that do not record it "
                          "(default: the one the checkpoint recorded)")
    p_export.add_argument("--tokenizer", default=None, metavar="DIR",
                          help="take the tokenizer from DIR (default: the run's model directory)")
    p_export.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                          help="cast the weights (default: the dtype they were trained in)")
    p_export.set_defaults(fn=_export)
    p_docs = sub.add_parser("docs", help="print a page or a topic of the migration guide",
                            description="Print the migration guide installed with coati-relay: without TOPIC, its "
                            "pages and topics; with a page name (rewriter, api_map, ...) the page; with a topic (the "
                            "NOTEs of a migrated script name theirs: `coati-relay docs four-role`) its section.")
    p_docs.add_argument("topic", nargs="?", default=None, metavar="TOPIC", help="a page name or a topic")
    p_docs.set_defaults(fn=_docs)
    add_registered_subcommands(sub)
    sub.add_parser("demo", help="GRPO, PPO and the legacy API on the toy task", add_help=False)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "demo":
        from coati_relay.demo import main as demo_main

        return demo_main(argv[1:])
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
