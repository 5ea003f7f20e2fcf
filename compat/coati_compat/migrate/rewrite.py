"""Writes the migrated script (and the equivalent YAML config for ``coati-relay run``) from a `Plan`.

The migrated script keeps the legacy command-line flags (names and defaults), computes the keywords of
``coati_relay.launch_distributed`` from them in ``launch_kwargs(args)``, and calls it in ``main()``. The YAML is that
function's result for given flags: the script is the single source of both.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

from coati_compat.migrate import emitted_colossalchat
from coati_compat.migrate.analyze import analyze_source, nothing_to_migrate
from coati_compat.migrate.colossalchat import KWARG_ORDER as COLOSSALCHAT_ORDER
from coati_compat.migrate.colossalchat import to_colossalchat
from coati_compat.migrate.custom_mapping import for_colossalchat
from coati_compat.migrate.four_role import build_four_role_plan, is_four_role
from coati_compat.migrate.mapping import Plan, build_plan
from coati_compat.migrate.notes import Note
from coati_relay.parts import from_legacy

# launch_distributed's keywords in the order of its signature (then the engine's additions).
KWARG_ORDER = ("num_producers", "num_proc_per_producer", "num_consumer_procs", "num_episodes", "inference_batch_size",
               "inference_microbatch_size", "train_batch_size", "train_minibatch_size", "train_dataset_config",
               "inference_model_config", "generate_config", "train_model_config", "grpo_config", "plugin_config",
               "inference_backend", "num_generations", "core_algo", "project_name", "critic_model_config",
               "reward_model_config", "run_dir", "save_dir", "seed", "timeout_s", "report_to")
WIDTH = 116
TARGETS = ("coati_relay", "colossalchat")
COMMAND = "coati-relay migrate"
# A script for this engine imports its helpers from `coati_relay.migration.from_legacy`; one for ColossalChat must run
# there without coati-relay, so it carries them (these tables with the functions that read them).
_HELPER_TABLES = {"legacy_hybrid_config": "LEGACY_STRATEGY_HYBRID", "system_prompt": "SYSTEM_PROMPTS"}
_HELPER_MODULES = (from_legacy, emitted_colossalchat)


@dataclass
class Migration:
    """The result of migrating one legacy script.

    script:       the migrated script's source.
    notes:        every NOTE it holds (also as comments in ``script``).
    untranslated: parts that need hand work (custom training steps, custom makers, missing actors).
    target:       whose launch_distributed the call is for: ``coati_relay`` (this engine) or ``colossalchat``.
    """

    legacy_name: str
    script: str
    notes: List[Note]
    untranslated: List[str]
    target: str = "coati_relay"

    @property
    def complete(self) -> bool:
        return not self.untranslated

    def launch_kwargs(self, flags: Union[Sequence[str], Mapping[str, Any], None] = None) -> Dict[str, Any]:
        """The migrated script's ``launch_kwargs`` for the legacy defaults overridden by ``flags``.

        flags: command-line arguments (``["--pretrain", "/models/actor"]``) or a mapping ``{"pretrain": ...}``.
        Required flags that are not given come out as None. Raises ValueError on flags the script does not take.
        """
        namespace: Dict[str, Any] = {"__name__": "coati_migrated_script"}
        exec(compile(self.script, f"<migrated {self.legacy_name}>", "exec"), namespace)  # noqa: S102 - our output
        parser = namespace["build_parser"]()
        for action in parser._actions:
            action.required = False
        argv = _flag_argv(parser, flags) if isinstance(flags, Mapping) else list(flags or [])
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            raise ValueError(f"the migrated {self.legacy_name} does not accept the flags {argv}; its flags are "
                             f"{sorted(a.dest for a in parser._actions if a.dest != 'help')}") from None
        return namespace["launch_kwargs"](args)

    def yaml(self, flags: Union[Sequence[str], Mapping[str, Any], None] = None) -> str:
        """A YAML file of ``launch_distributed`` keywords for ``coati-relay run``, with the NOTEs as comments."""
        import yaml

        if self.target != "coati_relay":
            raise ValueError(f"--yaml writes a config for `coati-relay run` (target coati_relay); ColossalChat has no "
                             f"YAML runner: run the migrated {self.target} script itself")
        kwargs = self.launch_kwargs(flags)
        if isinstance(flags, Mapping):
            flags = [f"--{k} {v}" for k, v in flags.items()]
        text = (f"launch_distributed keywords for `coati-relay run`, migrated from {self.legacy_name}; computed from "
                f"the legacy defaults and these flags: {' '.join(flags or []) or 'none'}.")
        empty = [k for k, v in _leaves(kwargs) if v is None and k != "run_dir"]
        if empty:
            text += f" Still empty, set before running: {', '.join(empty)}."
        head = [f"# {line}" for line in textwrap.wrap(text, width=WIDTH - 2, break_on_hyphens=False)]
        for note in self.notes:
            head += note.comment()
        return "\n".join(head) + "\n" + yaml.safe_dump(kwargs, sort_keys=False, width=116)


def _flag_argv(parser: argparse.ArgumentParser, flags: Mapping[str, Any]) -> List[str]:
    actions = {a.dest: a for a in parser._actions}
    argv: List[str] = []
    for dest, value in flags.items():
        action = actions.get(dest)
        if action is None or not action.option_strings:
            raise ValueError(f"the migrated script has no flag --{dest}; its flags are "
                             f"{sorted(d for d in actions if d != 'help')}")
        if action.nargs == 0:
            if str(value).lower() in ("1", "true", "yes", "on"):
                argv.append(action.option_strings[-1])
        else:
            argv += [action.option_strings[-1], str(value)]
    return argv


def _leaves(value: Any, prefix: str = ""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix, value


def fit_line(prefix: str, code: str, suffix: str = "", width: int = WIDTH) -> List[str]:
    """``prefix + code + suffix`` as lines of at most ``width`` characters where possible: a call or dict literal
    that does not fit is broken after its opening bracket, its items packed onto continuation lines."""
    line = prefix + code + suffix
    if len(line) <= width:
        return [line]
    node = ast.parse(code, mode="eval").body
    keyed: List[Tuple[str, ast.expr]] = []  # (prefix, value) of each item, so a long one can be broken in turn
    if isinstance(node, ast.Call):
        head, close = ast.unparse(node.func) + "(", ")"
        keyed = [("", a) for a in node.args] + [(f"{k.arg}=", k.value) for k in node.keywords]
    elif isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        head, close = "{", "}"
        keyed = [(f"{ast.unparse(k)}: ", v) for k, v in zip(node.keys, node.values)]
    elif isinstance(node, ast.List):
        head, close = "[", "]"
        keyed = [("", e) for e in node.elts]
    else:
        return [line]
    indent = " " * (len(prefix) - len(prefix.lstrip()) + 4)
    out, current = [prefix + head], indent
    for i, (key, value) in enumerate(keyed):
        comma = "," if i < len(keyed) - 1 else ""
        piece = key + ast.unparse(value) + (comma and ", ")
        if current.strip() and len(current + piece.rstrip()) > width:
            out.append(current.rstrip())
            current = indent
        if not current.strip() and len(indent + piece.rstrip()) > width:
            out += fit_line(indent + key, ast.unparse(value), comma, width)
            continue
        current += piece
    out.append(current.rstrip() + close + suffix if current.strip() else " " * (len(indent) - 4) + close + suffix)
    return out


def _table(name: str, table: Dict[str, Any], width: int = 120) -> List[str]:
    """``name = {...}``, one item per line; a dict value too long for one line gets a line per key."""
    out = [f"{name} = {{"]
    for k, v in table.items():
        line = f"    {k!r}: {v!r},"
        if len(line) > width and isinstance(v, dict):
            out += [f"    {k!r}: {{"] + [f"        {ik!r}: {iv!r}," for ik, iv in v.items()] + ["    },"]
        elif len(line) > width and isinstance(v, str):  # a long text: adjacent literals, one per line
            pieces, current = [], ""
            for word in re.findall(r"\S+\s*", v):
                if current and len(repr(current + word)) > width - 12:
                    pieces.append(current)
                    current = ""
                current += word
            out += [f"    {k!r}: ("] + [f"        {piece!r}" for piece in pieces + [current]] + ["    ),"]
        else:
            out.append(line)
    return out + ["}", ""]


def _emitted(name: str) -> Any:
    return next(getattr(m, name) for m in _HELPER_MODULES if hasattr(m, name))


def _helpers(plan: Plan) -> List[str]:
    if plan.target == "coati_relay":
        if not plan.helpers:
            return []
        head = f"from {from_legacy.__name__} import "
        lines = textwrap.wrap(", ".join(sorted(plan.helpers)), width=WIDTH - len(head) - 1, break_on_hyphens=False)
        if len(lines) > 1:
            lines = [f"({lines[0]}"] + [" " * (len(head) + 1) + line for line in lines[1:-1]] + [
                " " * (len(head) + 1) + lines[-1] + ")"]
        return [head + lines[0]] + lines[1:] + [""]
    out: List[str] = []
    for name in sorted(plan.helpers):
        if name in _HELPER_TABLES:
            table = _HELPER_TABLES[name]
            out += _table(table, _emitted(table)) + [""]
    for name in sorted(plan.helpers):
        out += inspect.getsource(_emitted(name)).rstrip().splitlines() + ["", ""]
    return out


def _main(plan: Plan) -> List[str]:
    """``main()``: this engine's, or ColossalChat's with the one import line to change and its Ray start."""
    extra = "".join(f", {key}={code}" for key, code in plan.main_kwargs.items())
    parsed = "build_parser().parse_args(argv)"
    if plan.target == "coati_relay":
        return ["def main(argv=None):",
                "    from coati_relay import launch_distributed  # imported here: reading launch_kwargs stays cheap",
                "",
                *([f"    args = {parsed}"] + [f"    {line}".rstrip() for line in plan.main_prelude]
                  if plan.main_prelude else []),
                f"    result = launch_distributed(**launch_kwargs({'args' if plan.main_prelude else parsed}){extra})",
                "    print(result.summary)",
                "    return result"]
    return ["def main(argv=None):",
            "    # To run on ColossalChat instead of coati-relay, change this one line to:",
            "    #     from coati.distributed.launch import launch_distributed",
            "    from coati_relay import launch_distributed  # imported here: reading launch_kwargs stays cheap",
            "",
            "    args = build_parser().parse_args(argv)"] + [f"    {line}" for line in plan.main_prelude] + [
            '    if not launch_distributed.__module__.startswith("coati_relay"):  # ColossalChat needs Ray started',
            "        import ray",
            "",
            '        ray.init(ignore_reinit_error=True, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})',
            "    result = launch_distributed(**launch_kwargs(args))",
            "    if result is not None:  # ColossalChat's launch_distributed returns None, coati-relay's a RunResult",
            "        print(result.summary)",
            "    return result"]


def render(plan: Plan, command: str = COMMAND) -> str:
    """The migrated script's source for ``plan``; ``command``: how the user ran the rewriter (named in the
    docstring)."""
    stem = re.sub(r"[^\w.-]", "_", plan.script_name.rsplit(".", 1)[0])
    cc = plan.target == "colossalchat"
    order = COLOSSALCHAT_ORDER if cc else KWARG_ORDER
    keys = [k for k in order if k in plan.kwargs] + [k for k in plan.kwargs if k not in order]
    notes = list(dict.fromkeys((n.topic, n.text, n.key, n.line) for n in plan.notes))
    notes = [Note(*n) for n in notes]
    header = [n for n in notes if n.key not in plan.kwargs]
    new_flags = ", ".join(f.split('"')[1] for f in plan.new_flags)
    kept = ("The legacy flags keep their names and defaults; added" if plan.legacy_flags
            else "The legacy script took no command-line flags; these are new")
    target_flag = "--target colossalchat " if cc else ""
    about = (f"Written by `{command} {target_flag}{stem}.py`. {kept}: {new_flags}. A `# NOTE:` marks each legacy "
             f"setting without an exact counterpart, with the command that explains it.")
    if cc:
        about = ("The call is ColossalChat's launch_distributed (coati.distributed, ColossalAI 4f9953be3): it runs on "
                 "coati-relay as written and on ColossalChat after the one import line in main() is changed. "
                 + about)
    target = "ColossalChat's launch_distributed" if cc else "coati_relay.launch_distributed"
    lines = [f'"""{stem}, migrated from the legacy coati.ray API to {target}.', ""]
    lines += textwrap.wrap(about, width=WIDTH, break_on_hyphens=False) + ['"""']
    lines += [
        "from __future__ import annotations",
        "",
        "import argparse",
    ]
    imports = ["argparse"] + (["csv", "json"] if "write_prompts_jsonl" in plan.helpers else [])
    imports += ["math"] if "round_sizes" in plan.helpers and cc else []
    imports += ["os"] if "write_prompts_jsonl" in plan.helpers else []
    imports += [line.split()[1] for line in plan.user_imports if re.fullmatch(r"import \w+", line)]
    lines += [f"import {name}" for name in sorted(set(imports)) if name != "argparse"]
    other = [line for line in plan.user_imports if not re.fullmatch(r"import \w+", line)]
    lines += ["from typing import Any, Dict", ""] + other + (([] if cc else _helpers(plan)) or ([""] if other else []))
    for note in sorted(header, key=lambda n: not n.text.startswith("NOT TRANSLATED")):
        lines += note.comment()
    lines += ["", ""] + (_helpers(plan) if cc else []) + plan.user_code
    lines += ["def build_parser() -> argparse.ArgumentParser:",
              f'    parser = argparse.ArgumentParser(description="{stem} on {target}")']
    for flag in plan.legacy_flags + plan.new_flags:
        lines += fit_line("    ", flag)
    lines += ["    return parser", "", ""]
    lines += ["def launch_kwargs(args: argparse.Namespace) -> Dict[str, Any]:",
              '    """The keywords of launch_distributed for these command-line arguments."""']
    for line in plan.prelude:
        target, sep, code = line.partition(" = ")
        lines += fit_line(f"    {target} = ", code) if sep and not line.startswith(" ") else [f"    {line}"]
    lines += ["    return dict("]
    for key in keys:
        for note in notes:
            if note.key == key:
                lines += note.comment("        ")
        lines += fit_line(f"        {key}=", plan.kwargs[key], ",")
    lines += ["    )", "", ""]
    lines += _main(plan) + ["", "", 'if __name__ == "__main__":', "    main()", ""]
    return "\n".join(lines)


def double_quotes(code: str) -> str:
    """Rewrites plain single-quoted one-line string literals (``ast.unparse`` writes them) with double quotes."""
    lines = code.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        text = tok.string
        if tok.type != tokenize.STRING or tok.start[0] != tok.end[0]:
            continue
        prefix = text[:len(text) - len(text.lstrip("rbfuRBFU"))]
        body = text[len(prefix):]
        if body[:1] == "'" and body[:3] != "'" * 3 and '"' not in body and "\\" not in body:
            row, col = tok.start[0] - 1, tok.start[1]
            line = lines[row]
            lines[row] = f'{line[:col]}{prefix}"{body[1:-1]}"{line[col + len(text):]}'
    return "".join(lines)


def migrate_source(text: str, name: str = "legacy_script.py", target: str = "coati_relay",
                   command: str = COMMAND) -> Migration:
    """Migrates the source of a legacy launch script (it is parsed, never run).

    target: ``coati_relay`` (this engine, PPO with a critic and a reward model as the legacy script had) or
    ``colossalchat`` (ColossalChat's launch_distributed: the GRPO family, rule-based rewards; see
    `coati_compat.migrate.colossalchat`). command: how the user ran the rewriter (the docstring names it).
    """
    if target not in TARGETS:
        raise ValueError(f"unknown migration target {target!r}; use one of {list(TARGETS)}")
    script = analyze_source(text, name, require_actors=False)
    if script.makers or script.trainers:
        plan = build_plan(script)
    elif is_four_role(script.tree):
        plan = build_four_role_plan(script)
    else:
        raise ValueError(nothing_to_migrate(name))
    if target == "colossalchat":
        plan = for_colossalchat(to_colossalchat(plan, script))
    migrated = double_quotes(render(plan, command))
    compile(migrated, f"<migrated {name}>", "exec")  # the rewriter's own output must always be valid Python
    return Migration(legacy_name=name, script=migrated, notes=plan.notes, untranslated=plan.untranslated,
                     target=target)


def migrate_file(path: Union[str, Path], target: str = "coati_relay", command: str = COMMAND) -> Migration:
    """Migrates the legacy launch script at ``path`` (``target``, ``command``: see `migrate_source`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"legacy script {path} does not exist; pass the path of a .py launch script")
    return migrate_source(path.read_text(encoding="utf-8"), name=path.name, target=target, command=command)
