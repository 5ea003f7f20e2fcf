"""What the rewriter fills (`Plan`) and the context each mapping step works in (`MappingContext`)."""
from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from coati_compat.migrate.analyze import ActorCall, LegacyScript
from coati_compat.migrate.expressions import evaluate, source
from coati_compat.migrate.notes import Note

# Flags that name the W&B project (ColossalChat's rl_example.py: -p/--project) and that switch W&B on.
PROJECT_FLAGS = ("project_name", "project", "wandb_project")
WANDB_FLAGS = ("use_wandb", "wandb")


@dataclass
class Plan:
    """What the migrated script holds. Code strings read ``args.<flag>`` and the helpers named in ``helpers``.

    target: whose ``launch_distributed`` the call is written for (``coati_relay`` or ``colossalchat``);
    main_prelude: lines ``main()`` runs between parsing the flags and the launch; main_kwargs: launch keywords
    ``main()`` adds (objects no YAML holds: hooks); user_code, user_imports: the script's own classes and functions
    carried over (`coati_compat.migrate.custom_code`) and the imports they need.
    """

    script_name: str
    legacy_flags: List[str] = field(default_factory=list)
    new_flags: List[str] = field(default_factory=list)
    prelude: List[str] = field(default_factory=list)
    kwargs: Dict[str, str] = field(default_factory=dict)
    helpers: List[str] = field(default_factory=list)
    notes: List[Note] = field(default_factory=list)
    untranslated: List[str] = field(default_factory=list)
    target: str = "coati_relay"
    main_prelude: List[str] = field(default_factory=list)
    main_kwargs: Dict[str, str] = field(default_factory=dict)
    user_code: List[str] = field(default_factory=list)
    user_imports: List[str] = field(default_factory=list)


class MappingContext:
    """The legacy script being mapped, the plan being filled, and the small tools every mapping step uses.

    script: the analysed legacy script; resolver: its expression resolver; plan: the migrated script so far;
    defaults: the legacy flags' defaults (to compute values the way the legacy script would).
    """

    def __init__(self, script: LegacyScript):
        self.script = script
        self.resolver = script.resolver
        self.plan = Plan(script_name=script.name)
        self.defaults = argparse.Namespace(**{d: f.default for d, f in script.flags.items()})

    def note(self, topic: str, text: str, key: Optional[str] = None, line: int = 0) -> None:
        self.plan.notes.append(Note(topic, text, key, line))

    def untranslated(self, text: str, line: int = 0) -> None:
        self.plan.untranslated.append(f"{text} (legacy line {line})" if line else text)
        self.note("custom-classes", f"NOT TRANSLATED: {text}", None, line)

    def helper(self, name: str) -> str:
        if name not in self.plan.helpers:
            self.plan.helpers.append(name)
        return name

    def code(self, node: Optional[ast.expr]) -> Optional[str]:
        value = self.resolver.portable(node)
        return None if value is None else source(value)

    def value(self, node: Optional[ast.expr]) -> Any:
        """The value of a legacy expression with the legacy defaults (None when it cannot be computed)."""
        value = self.resolver.portable(node)
        if value is None:
            return None
        try:
            return evaluate(value, self.defaults)
        except Exception:  # arithmetic on a default of None, etc.: the value is unknown until run time
            return None

    def new_flag(self, dest: str, spec: str) -> str:
        """Adds ``--dest`` to the migrated script (``--relay_dest`` when the legacy script has a --dest)."""
        if dest in self.script.flags:
            dest = f"relay_{dest}"
        self.plan.new_flags.append(f'parser.add_argument("--{dest}", {spec})')
        return f"args.{dest}"

    def kw(self, site: Optional[ActorCall], name: str) -> Optional[ast.expr]:
        return None if site is None else site.kwargs.get(name)

    def trackers(self) -> None:
        """``project_name`` and ``report_to``: the script's own project and W&B flags where it has them, else the
        script's name and a new ``--report_to`` flag (trackers besides ``run_dir/metrics.jsonl``)."""
        flags, kwargs = self.script.flags, self.plan.kwargs
        project = next((f for f in PROJECT_FLAGS if f in flags), None)
        kwargs["project_name"] = f"args.{project}" if project else repr(self.script.name.rsplit(".", 1)[0])
        if "report_to" in flags:
            kwargs["report_to"] = "args.report_to"
            return
        kwargs["report_to"] = self.new_flag("report_to", 'nargs="*", default=[], choices=["tensorboard", "wandb", '
                                                         '"none"]')
        switch = next((f for f in WANDB_FLAGS if f in flags), None)
        if switch:
            kwargs["report_to"] += f' + (["wandb"] if args.{switch} else [])'
            self.note("trackers", f"--{switch} adds 'wandb' to report_to: the run logs to the W&B project "
                                  f"project_name (offline under run_dir/wandb without a W&B login).", key="report_to")

    def seed_and_save_dir(self, saves: str) -> None:
        """``seed``, ``save_dir`` and ``timeout_s`` from the script's flags of those names, which mean the same there.

        saves: what the legacy script saved in ``--save_dir`` (for the NOTE)."""
        for name in ("seed", "save_dir", "timeout_s"):
            if name in self.script.flags:
                self.plan.kwargs[name] = f"args.{name}"
        if "save_dir" in self.script.flags:
            unset = " (under run_dir when None)" if self.defaults.save_dir is None else ""
            self.note("seed-and-save-dir", f"the legacy script saved {saves} in --save_dir; the engine's "
                                           f"checkpoints go to save_dir/checkpoints/step-NNNNNN{unset}.",
                      key="save_dir")
