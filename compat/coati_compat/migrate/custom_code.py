"""Carries a legacy script's own classes into the migrated script.

- A ``DetachedTrainer`` subclass whose ``training_step`` computes a policy-gradient loss becomes a policy loss
  function (`coati_relay.algorithms.registry`'s signature), registered in ``main()`` under the class's name and named
  in ``grpo_config["policy_loss"]``; the run uses RLOO advantages and no critic. Each line that had to change carries
  a NOTE. A step that also trains a critic (a second loss computed from ``self.critic*(...)``) carries that loss too,
  as a value loss registered under the same name and named in ``grpo_config["value_loss"]``; that run is PPO.
- A ``TrainerCallback`` / ``MakerCallback`` subclass becomes a hook class (`coati_relay.callbacks`) passed as
  ``callbacks=[...]``; legacy methods without a moment in the engine stay, with a NOTE naming the closest hook.

What cannot be carried (a training step that reads what the loss never gets, a custom maker) stays NOT TRANSLATED.
"""
from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from coati_compat.migrate.analyze import CustomClass
from coati_compat.migrate.notes import Note

# Experience fields a policy loss receives, by the loss argument that holds them.
EXPERIENCE_ARGS = {"action_mask": "mask", "advantages": "advantages", "action_log_probs": "old_logp"}
# Experience fields a value loss receives, by the loss argument that holds them.
VALUE_ARGS = {"action_mask": "mask", "values": "old_values", "reward": "returns"}
# Names a training step may import from the legacy package, and where the migrated script takes them from.
LEGACY_NAMES = {"masked_mean": "from coati_relay.algorithms import masked_mean"}
# Legacy callback methods -> (engine hook, its parameters after self).
TRAINER_HOOKS = {"on_fit_start": ("on_run_start", "config"), "on_fit_end": ("on_run_end", "result"),
                 "on_batch_end": ("on_round_end", "step, metrics")}
MAKER_HOOKS = {"on_loop_start": ("on_run_start", "config"), "on_loop_end": ("on_run_end", "result")}
# Legacy callback methods that have no moment in the engine, and the closest hook.
NO_MOMENT = {"on_episode_start": "on_round_end", "on_episode_end": "on_round_end", "on_epoch_start": "on_round_end",
             "on_epoch_end": "on_round_end", "on_batch_start": "on_round_end", "on_update_start": "on_round_end",
             "on_update_end": "on_round_end", "on_make_experience_start": "on_round_end",
             "on_make_experience_end": "on_round_end", "on_send_start": "on_round_end",
             "on_send_end": "on_round_end"}
# How the engine's metrics name what a training step commonly returned.
REWARD_FIELDS = {"reward"}


def _note(text: str, line: int = 0) -> Note:
    return Note("custom-classes", text, None, line)


@dataclass
class CarriedLoss:
    """A training step carried as a policy loss: the function's source and the legacy metric names it maps
    (legacy key -> key of the engine's metrics record)."""

    class_name: str
    function: str
    source: List[str]
    metrics: Dict[str, str]
    imports: Set[str] = field(default_factory=set)
    value_loss: Optional["CarriedLoss"] = None


def loss_function_name(class_name: str) -> str:
    """``DetachedPGTrainer`` -> ``detached_pg_trainer_loss``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", class_name).lower() + "_loss"


class _StepReader:
    """Rewrites the statements of one ``training_step(self, experience)`` onto the policy loss's arguments."""

    FIELDS = EXPERIENCE_ARGS
    OUTPUT = "logp"  # the loss argument that holds the model's output
    OUTPUT_WHY = ("the learner computes the policy's log-probs of the response tokens (logp [B,T], with grad) before "
                  "it calls the loss.")
    SHARE_WHY = ("each batch mean becomes a sum over this micro-batch divided by num_samples (the samples of the "
                 "whole optimizer step); that is the legacy mean only where the tensor holds one value per sample "
                 "([B]): a mean over a [B,T] tensor needs its tokens averaged first (masked mean over dim 1)")

    def __init__(self, step: ast.FunctionDef, legacy_imports: Dict[str, str], value_loss_name: Optional[str] = None):
        self.step = step
        self.exp = step.args.args[1].arg if len(step.args.args) > 1 else "experience"
        self.legacy_imports = legacy_imports
        self.value_loss_name = value_loss_name  # the critic's loss, carried apart: its metric is the engine's
        self.loss_name: Optional[str] = None
        self.problem: Optional[str] = None
        self.imports: Set[str] = set()

    def _fail(self, text: str) -> None:
        self.problem = self.problem or text

    def _is_self_call(self, node: ast.AST) -> bool:
        """``self.<x>...(...)``: a call on the trainer's own models, optimizers or strategy."""
        while isinstance(node, (ast.Call, ast.Attribute)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and node.id == "self"

    def _backward_target(self, stmt: ast.stmt) -> Optional[str]:
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
            return None
        call = stmt.value
        if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
            if isinstance(call.func.value, ast.Name):
                return call.func.value.id
            if self._is_self_call(call) and call.args and isinstance(call.args[0], ast.Name):
                return call.args[0].id  # self.strategy.backward(loss, model, optimizer)
        return None

    def _experience_fields(self, node: ast.AST) -> ast.AST:
        """``experience.<field>`` -> the loss argument; a field the loss does not receive is a problem."""
        reader = self

        class Fields(ast.NodeTransformer):
            def visit_Attribute(self, n: ast.Attribute):
                if isinstance(n.value, ast.Name) and n.value.id == reader.exp:
                    if n.attr in reader.FIELDS:
                        return ast.Name(id=reader.FIELDS[n.attr], ctx=ast.Load())
                    reader._fail(f"{reader.exp}.{n.attr} (the loss gets {', '.join(reader.FIELDS)} of the "
                                 f"experience, as {', '.join(reader.FIELDS.values())})")
                return self.generic_visit(n)

            def visit_Name(self, n: ast.Name):
                if n.id in reader.legacy_imports:
                    if n.id in LEGACY_NAMES:
                        reader.imports.add(LEGACY_NAMES[n.id])
                    else:
                        reader._fail(f"{n.id} (imported from {reader.legacy_imports[n.id]})")
                return n

        return Fields().visit(copy.deepcopy(node))

    @staticmethod
    def _share(mean_of: ast.expr) -> ast.expr:
        """``X`` of a batch mean ``X.mean()`` -> this micro-batch's share: ``X.sum() / num_samples``."""
        summed = ast.Call(func=ast.Attribute(value=mean_of, attr="sum", ctx=ast.Load()), args=[], keywords=[])
        return ast.BinOp(left=summed, op=ast.Div(), right=ast.Name(id="num_samples", ctx=ast.Load()))

    @classmethod
    def _mean_to_share(cls, value: ast.expr) -> Optional[ast.expr]:
        """Each batch mean ``X.mean()`` -> its share (`_share`) in a loss that is a sum of such means (signs,
        constant factors); None for other forms."""
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "mean" \
                and not value.args and not value.keywords:
            return cls._share(value.func.value)
        if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
            inner = cls._mean_to_share(value.operand)
            return None if inner is None else ast.UnaryOp(op=value.op, operand=inner)
        if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Add, ast.Sub)):
            left, right = cls._mean_to_share(value.left), cls._mean_to_share(value.right)
            return None if left is None or right is None else ast.BinOp(left=left, op=value.op, right=right)
        if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Mult, ast.Div)):
            if isinstance(value.left, ast.Constant) and isinstance(value.op, ast.Mult):
                inner = cls._mean_to_share(value.right)
                return None if inner is None else ast.BinOp(left=value.left, op=value.op, right=inner)
            if isinstance(value.right, ast.Constant):
                inner = cls._mean_to_share(value.left)
                return None if inner is None else ast.BinOp(left=inner, op=value.op, right=value.right)
        return None

    def read(self) -> Optional[Tuple[List[Tuple[Optional[str], ast.stmt]], Dict[str, str], List[str]]]:
        """(statements each with the NOTE for its change, metric map, NOTEs of dropped lines), or None."""
        body = [s for s in self.step.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        for stmt in body:
            self.loss_name = self.loss_name or self._backward_target(stmt)
        if self.loss_name is None:
            self._fail("no loss.backward() (or self.strategy.backward(loss, ...)) to tell which value is the loss")
            return None
        kept: List[Tuple[Optional[str], ast.stmt]] = []
        dropped: List[str] = []
        metrics: Dict[str, str] = {}
        for stmt in body:
            src = ast.unparse(stmt)
            if self._backward_target(stmt) is not None or (isinstance(stmt, ast.Expr) and self._is_self_call(
                    stmt.value)):
                dropped.append(f"`{src}` (line {stmt.lineno}): dropped; the learner sets train mode, runs the "
                               f"backward pass, the optimizer step and zero_grad itself.")
            elif isinstance(stmt, ast.Return):
                metrics = self._metrics(stmt, dropped)
            elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                  and isinstance(stmt.value, ast.Call) and self._is_self_call(stmt.value)):
                name, why = stmt.targets[0].id, self.OUTPUT_WHY
                if name == self.OUTPUT:
                    dropped.append(f"`{src}` (line {stmt.lineno}): dropped; {why}")
                else:
                    kept.append((f"`{src}` (line {stmt.lineno}) -> `{name} = {self.OUTPUT}`: {why}",
                                 ast.parse(f"{name} = {self.OUTPUT}").body[0]))
            elif isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == self.loss_name
                                                      for t in stmt.targets):
                value = self._experience_fields(stmt.value)
                share = self._mean_to_share(value)
                new = ast.Assign(targets=stmt.targets, value=share or value, lineno=stmt.lineno)
                if share is not None:
                    note = (f"`{src}` (line {stmt.lineno}): {self.SHARE_WHY}: the learner calls the loss per "
                            f"micro-batch and adds the results up.")
                else:
                    note = (f"`{src}` (line {stmt.lineno}): kept as written, but the learner calls the loss per "
                            f"micro-batch and adds the results up: make it this micro-batch's share of the batch's "
                            f"loss (divide sums by num_samples or total_tokens), or set train_microbatch_size to "
                            f"the whole batch.")
                kept.append((note, ast.fix_missing_locations(new)))
            elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.If, ast.Expr)):
                new = ast.fix_missing_locations(self._experience_fields(stmt))
                changed = ast.unparse(new) != src
                kept.append((f"`{src}` (line {stmt.lineno}): the experience's fields are the loss's arguments."
                             if changed else None, new))
            else:
                self._fail(f"`{src.splitlines()[0]}` (line {stmt.lineno}): a {type(stmt).__name__} statement")
        if self.problem:
            return None
        kept = self._without_unused(kept, dropped)
        if not any(isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == self.loss_name
                                                     for t in s.targets) for _, s in kept):
            self._fail(f"{self.loss_name} is never assigned in the step")
            return None
        return kept, metrics, dropped

    def _metrics(self, stmt: ast.Return, dropped: List[str]) -> Dict[str, str]:
        """The returned dict's keys mapped to the engine's metric names: the loss -> ``loss``, a reward -> ``reward``;
        the others are dropped with a NOTE."""
        out: Dict[str, str] = {}
        if not isinstance(stmt.value, ast.Dict):
            dropped.append(f"`{ast.unparse(stmt)}` (line {stmt.lineno}): the loss returns (loss, stats); the "
                           f"engine logs loss, reward and its own metrics.")
            return out
        for key, value in zip(stmt.value.keys, stmt.value.values):
            ok = isinstance(key, ast.Constant) and isinstance(key.value, str)
            names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
            fields = {n.attr for n in ast.walk(value) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == self.exp}
            if ok and names == {self.loss_name}:
                out[key.value] = "loss"
            elif ok and self.value_loss_name and names == {self.value_loss_name}:
                out[key.value] = "value_loss"
            elif ok and fields and fields <= REWARD_FIELDS:
                out[key.value] = "reward"
            else:
                dropped.append(f"the metric {ast.unparse(key)}: {ast.unparse(value)} (line {stmt.lineno}) has no "
                               f"counterpart in the engine's metrics; it is not logged.")
        if out:
            named = ", ".join(f"{k} as {v!r}" for k, v in out.items())
            dropped.append(f"`return {{...}}` (line {stmt.lineno}) -> `return {self.loss_name}, {{}}`: the engine "
                           f"logs {named} in its metrics; the carried hooks get them back under the legacy names.")
        return out

    def _without_unused(self, kept, dropped):
        """Drops assignments whose name nothing later reads (``num_actions`` once the model call is gone)."""
        while True:
            used = {n.id for _, s in kept for n in ast.walk(s) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Load)} | {self.loss_name}
            unused = [(note, s) for note, s in kept if isinstance(s, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id not in used for t in s.targets)]
            if not unused:
                return kept
            for _, s in unused:
                original = next(st for st in self.step.body if getattr(st, "lineno", -1) == s.lineno)
                dropped.append(f"`{ast.unparse(original)}` (line {s.lineno}): dropped; nothing reads it once the "
                               f"learner computes the model's output.")
            kept = [(note, s) for note, s in kept if (note, s) not in unused]


class _ValueStepReader(_StepReader):
    """Rewrites the critic's statements of a training step onto the value loss's arguments."""

    FIELDS = VALUE_ARGS
    OUTPUT = "values"
    OUTPUT_WHY = ("the learner computes the critic's values (values [B,T], one per response token, with grad; the "
                  "legacy critic gave one per sequence, [B]) before it calls the loss.")
    SHARE_WHY = ("each batch mean becomes a masked sum over this micro-batch's response tokens divided by "
                 "total_tokens (the valid tokens of the whole optimizer step): a mean over tokens, as the engine's "
                 "values and returns are per token")

    @staticmethod
    def _share(mean_of: ast.expr) -> ast.expr:
        """``X`` of a batch mean ``X.mean()`` -> ``(X * mask).sum() / total_tokens``."""
        masked = ast.BinOp(left=mean_of, op=ast.Mult(), right=ast.Name(id="mask", ctx=ast.Load()))
        summed = ast.Call(func=ast.Attribute(value=masked, attr="sum", ctx=ast.Load()), args=[], keywords=[])
        return ast.BinOp(left=summed, op=ast.Div(), right=ast.Name(id="total_tokens", ctx=ast.Load()))


def _reads(stmt: ast.stmt) -> Set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _writes(stmt: ast.stmt) -> Set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _split_critic(step: ast.FunctionDef) -> Tuple[ast.FunctionDef, Optional[ast.FunctionDef], Optional[str]]:
    """(the actor's step, the critic's step or None, the critic's loss name or None): with two losses and one of them
    computed from a ``self.critic*(...)`` call, the statements that only the critic's loss needs (its backward, its
    optimizer's calls) go to the critic's step; the rest (the return with its metrics) stays."""
    reader = _StepReader(step, {})
    losses = [t for t in map(reader._backward_target, step.body) if t]

    def needs(name: str) -> Set[int]:  # indexes of the statements the loss is computed from
        wanted, out = {name}, set()
        for i in reversed(range(len(step.body))):
            stmt = step.body[i]
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and _writes(stmt) & wanted:
                out.add(i)
                wanted |= _reads(stmt)
        return out

    def on_critic(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                   and n.attr.startswith("critic") for n in ast.walk(node))

    critic = next((name for name in losses if any(on_critic(step.body[i]) for i in needs(name))), None)
    if len(losses) != 2 or critic is None:
        return step, None, None
    actor_needs = set().union(*(needs(name) for name in losses if name != critic))
    mine = {i for i in needs(critic) if i not in actor_needs} | {
        i for i, stmt in enumerate(step.body) if reader._backward_target(stmt) == critic
        or (isinstance(stmt, ast.Expr) and reader._is_self_call(stmt.value) and on_critic(stmt))}
    actor, value = copy.copy(step), copy.copy(step)
    actor.body = [s for i, s in enumerate(step.body) if i not in mine]
    value.body = [s for i, s in enumerate(step.body) if i in mine or (i in needs(critic) and i in actor_needs)]
    return actor, value, critic


def value_loss_function_name(class_name: str) -> str:
    """``HuberActorCritic`` -> ``huber_actor_critic_value_loss``."""
    return loss_function_name(class_name)[:-len("_loss")] + "_value_loss"


def _body(reader: _StepReader, kept, dropped) -> List[str]:
    lines: List[str] = []
    for text in sorted(dropped, key=lambda t: int(re.search(r"\(line (\d+)\)", t).group(1))):
        lines += Note("custom-classes", text).comment("    ")
    for note, stmt in kept:
        if note:
            lines += Note("custom-classes", note).comment("    ")
        lines += ["    " + line for line in ast.unparse(stmt).splitlines()]
    return lines


def _carry_value_loss(cls: ast.ClassDef, step: ast.FunctionDef, legacy_imports: Dict[str, str]
                      ) -> Tuple[Optional[CarriedLoss], Optional[str]]:
    reader = _ValueStepReader(step, legacy_imports)
    read = reader.read()
    if read is None:
        return None, f"its training_step's critic loss reads what a value loss does not get: {reader.problem}"
    kept, _, dropped = read
    name = value_loss_function_name(cls.name)
    lines = [f"def {name}(values, old_values, returns, clip_eps, mask, total_tokens):",
             f'    """The critic\'s loss of {cls.name}.training_step (legacy line {step.lineno}) as a value loss,',
             f'    registered as {cls.name!r}.',
             "",
             "    values: [B,T] of the critic being trained (with grad); old_values: [B,T] at rollout time (the legacy",
             "    experience.values); returns: [B,T] targets (in place of the legacy experience.reward); mask: [B,T];",
             "    clip_eps: value_clip (unused here); total_tokens: valid tokens of the whole optimizer step.",
             "    Returns a scalar.",
             '    """']
    lines += _body(reader, kept, dropped) + [f"    return {reader.loss_name}"]
    return CarriedLoss(cls.name, name, lines, {}, reader.imports), None


def carry_loss(cls: ast.ClassDef, legacy_imports: Dict[str, str]) -> Tuple[Optional[CarriedLoss], Optional[str]]:
    """The policy loss (and the value loss, where the step trains a critic too) for a ``DetachedTrainer`` subclass,
    or (None, why it cannot be carried)."""
    whole = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "training_step"), None)
    if whole is None:
        return None, "it defines no training_step"
    step, critic_step, critic_loss = _split_critic(whole)
    value = None
    if critic_step is not None:
        value, why = _carry_value_loss(cls, critic_step, legacy_imports)
        if value is None:
            return None, why
    reader = _StepReader(step, legacy_imports, critic_loss)
    read = reader.read()
    if read is None:
        return None, f"its training_step reads what a policy loss does not get: {reader.problem}"
    kept, metrics, dropped = read
    name = loss_function_name(cls.name)
    lines = [f"def {name}(logp, old_logp, advantages, mask, num_samples, **options):",
             f'    """{cls.name}.training_step (legacy line {whole.lineno}) as a policy loss, registered as '
             f'{cls.name!r}.',
             "",
             "    logp, old_logp, mask: [B,T] (mask 1 on response tokens); advantages: [B,1] or [B,T]; num_samples:",
             "    samples of the whole optimizer step. Returns (scalar loss, stats).",
             '    """']
    lines += _body(reader, kept, dropped) + [f"    return {reader.loss_name}, {{}}"]
    return CarriedLoss(cls.name, name, lines, metrics, reader.imports | (value.imports if value else set()),
                       value), None


def carry_callback(cls: ast.ClassDef, kind_base: str, metrics: Dict[str, str]) -> List[str]:
    """The hook class for a legacy callback class: the same class without its legacy base, each method with a
    moment renamed to its hook; ``metrics`` (legacy key -> engine key) rebuilds the legacy metrics dict."""
    table = TRAINER_HOOKS if kind_base == "TrainerCallback" else MAKER_HOOKS
    out = copy.deepcopy(cls)
    out.bases = [b for b in out.bases if (b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")) != kind_base]
    notes: Dict[str, List[str]] = {}
    for fn in out.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
            continue
        if fn.name in table:
            hook, params = table[fn.name]
            legacy = [a.arg for a in fn.args.args[1:]]
            notes[hook] = [f"{fn.name}({', '.join(legacy)}) -> {hook}({params}) (legacy line {fn.lineno})."]
            if fn.name == "on_batch_end":
                metrics_name = legacy[0] if legacy else "metrics"
                fn.args.args = [fn.args.args[0], ast.arg(arg="step"), ast.arg(arg=metrics_name)]
                prelude = []
                if metrics:
                    mapped = ", ".join(f"{k!r}: {metrics_name}[{v!r}]" for k, v in metrics.items())
                    prelude.append(ast.parse(f"{metrics_name} = {{{mapped}}}").body[0])
                    notes[hook].append("the engine calls it once a round (one weight version, after all of the "
                                       "round's optimizer steps) with the round's metrics record; the line below "
                                       "rebuilds the legacy training step's metrics from it.")
                else:
                    prelude.append(ast.parse(f"{metrics_name} = {{k: v for k, v in {metrics_name}.items() "
                                             f"if k not in ('step', 'time')}}").body[0])
                    notes[hook].append("the engine calls it once a round with the round's metrics record.")
                if len(legacy) > 1 and any(isinstance(n, ast.Name) and n.id == legacy[1] for n in ast.walk(fn)):
                    prelude.append(ast.parse(f"{legacy[1]} = None").body[0])
                    notes[hook].append(f"no experience reaches a hook: {legacy[1]} is None (run_dir/rollouts/ "
                                       f"holds the rollouts with rollout_log=True).")
                fn.body = prelude + fn.body
            else:
                fn.args.args = [fn.args.args[0]] + [ast.arg(arg=p.strip()) for p in params.split(",")]
            fn.name = hook
        elif fn.name in NO_MOMENT:  # renamed: launch_distributed refuses an on_* method close to a hook's name
            notes[f"legacy_{fn.name}"] = [f"{fn.name} (legacy line {fn.lineno}) has no moment in the engine: renamed "
                                          f"legacy_{fn.name}, never called; the closest hook is "
                                          f"{NO_MOMENT[fn.name]}."]
            fn.name = f"legacy_{fn.name}"
    text = ast.unparse(ast.fix_missing_locations(out)).splitlines()
    lines: List[str] = []
    for line in text:
        match = re.match(r"(\s*)def (\w+)\(", line)
        if match and match.group(2) in notes:
            for note in notes[match.group(2)]:
                lines += Note("custom-classes", note).comment(match.group(1))
        lines.append(line)
    return lines


def other_imports(tree: ast.Module, code: List[str]) -> List[str]:
    """The script's top-level imports (other than the legacy package and Ray) of the names ``code`` reads."""
    used = {n.id for n in ast.walk(ast.parse("\n".join(code))) if isinstance(n, ast.Name)}
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
            out += [f"import {a.name}" + (f" as {a.asname}" if a.asname else "") for a in names
                    if a.name.split(".")[0] not in ("ray", "coati")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] not in ("ray", "coati", ""):
            names = [a for a in node.names if (a.asname or a.name) in used]
            if names:
                out.append(f"from {node.module} import " + ", ".join(
                    a.name + (f" as {a.asname}" if a.asname else "") for a in names))
    return out


def legacy_imports(tree: ast.Module) -> Dict[str, str]:
    """Names the script imports from the legacy ``coati`` package -> their module."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "coati":
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    return out


def class_node(tree: ast.Module, custom: CustomClass) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == custom.name)
