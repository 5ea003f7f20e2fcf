"""The `coati-relay` command: ``run CONFIG.yaml``, ``plot RUN_DIR...``, ``demo``, and the subcommands other packages
register under the entry-point group ``coati_relay.subcommands`` (``migrate``, from coati_compat)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib.metadata import entry_points
from typing import List, Optional

SUBCOMMAND_GROUP = "coati_relay.subcommands"


def _run(args: argparse.Namespace) -> int:
    import yaml

    from coati_relay.config import ConfigError
    from coati_relay.launch import RunFailed, launch_distributed
    from coati_relay.metrics import summary_table

    with open(args.config) as f:
        kwargs = yaml.safe_load(f)
    if not isinstance(kwargs, dict):
        print(f"coati-relay run: {args.config} must hold a mapping of launch_distributed keywords", file=sys.stderr)
        return 2
    try:
        result = launch_distributed(**kwargs)
    except (ConfigError, TypeError) as exc:
        print(f"coati-relay run: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"coati-relay run: the run failed: {exc}", file=sys.stderr)
        return 1
    print(summary_table([result.summary], list(result.summary)))
    print(f"run dir: {result.run_dir}; checkpoints: {result.checkpoints}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from coati_relay.plotting import plot_run

    png = plot_run(args.run_dirs if len(args.run_dirs) > 1 else args.run_dirs[0], out_png=args.out)
    print(png)
    return 0


def add_registered_subcommands(sub: argparse._SubParsersAction) -> None:
    """Calls each ``coati_relay.subcommands`` entry point with ``sub``; one whose package is not importable (the
    engine installed without coati_compat) is left out."""
    for entry in entry_points(group=SUBCOMMAND_GROUP):
        try:
            add = entry.load()
        except ImportError:
            continue
        add(sub)


def main(argv: Optional[List[str]] = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("coati_relay.metrics").setLevel(logging.INFO)  # progress lines when stdout is no terminal
    parser = argparse.ArgumentParser(prog="coati-relay")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="launch_distributed with the keywords of a YAML file")
    p_run.add_argument("config")
    p_run.set_defaults(fn=_run)
    p_plot = sub.add_parser("plot", help="PNG of reward and loss per step of one or more run dirs")
    p_plot.add_argument("run_dirs", nargs="+")
    p_plot.add_argument("-o", "--out", default=None)
    p_plot.set_defaults(fn=_plot)
    add_registered_subcommands(sub)
    sub.add_parser("demo", help="GRPO, PPO and the legacy API on the toy task", add_help=False)
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "demo":
        from coati_relay.demo import main as demo_main

        return demo_main(argv[1:])
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
