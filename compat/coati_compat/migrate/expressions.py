"""Reading values out of a legacy script's syntax tree: which expressions can move into a migrated script.

An expression is *portable* when it uses only literals, command-line flags (``args.<flag>``), arithmetic,
comparisons, conditionals, containers and a few pure builtins. Local names are replaced by the value they were
assigned (``dataset_size = args.experience_batch_size * 4``), when that assignment is unique. Anything else (calls
into the user's code, attribute chains, lambdas) is not portable: the rewriter reports it instead of guessing.
"""
from __future__ import annotations

import ast
import builtins
import copy
from typing import Dict, Iterable, List, Optional, Set, Tuple

_PURE_BUILTINS = {"int", "float", "str", "bool", "min", "max", "abs", "round", "len"}
_TYPE_NAMES = {"int", "float", "str", "bool"}
_MAX_DEPTH = 12


def call_name(node: ast.AST) -> Optional[str]:
    """The last name of a call's function: ``a.b.c(...)`` -> ``"c"``, ``f(...)`` -> ``"f"``."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def keyword_map(call: ast.Call, params: Iterable[str] = ()) -> Dict[str, ast.expr]:
    """Arguments of ``call`` by parameter name; positional ones are named after ``params`` in order."""
    names = list(params)
    out: Dict[str, ast.expr] = {}
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):
            break
        out[names[i] if i < len(names) else f"<arg{i}>"] = arg
    for kw in call.keywords:
        if kw.arg is not None:
            out[kw.arg] = kw.value
    return out


def literal(node: Optional[ast.expr]) -> Tuple[bool, object]:
    """(True, value) when ``node`` is a plain literal, else (False, None)."""
    if node is None:
        return False, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def source(node: ast.AST) -> str:
    return ast.unparse(node)


class Resolver:
    """Knows the script's assignments and flags; turns expressions into portable ones.

    tree:       the parsed legacy script.
    flags:      dests of the script's argparse options.
    args_names: names the parsed arguments are bound to (``args = parser.parse_args()`` -> ``{"args"}``).
    """

    def __init__(self, tree: ast.Module, flags: Set[str], args_names: Set[str]):
        self.flags = set(flags)
        self.args_names = set(args_names) | {"args"}
        self.assignments: Dict[str, List[ast.expr]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assignments.setdefault(node.targets[0].id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.assignments.setdefault(node.target.id, []).append(node.value)

    def assigned(self, name: str) -> Optional[ast.expr]:
        """The value ``name`` is bound to, when every assignment to it in the script is the same expression."""
        values = self.assignments.get(name, [])
        if not values or len({ast.dump(v) for v in values}) != 1:
            return None
        return values[0]

    def flag_of(self, node: ast.AST) -> Optional[str]:
        """``args.pretrain`` -> ``"pretrain"`` (only for known flags); else None."""
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in self.args_names and node.attr in self.flags):
            return node.attr
        return None

    def portable(self, node: Optional[ast.expr], depth: int = 0) -> Optional[ast.expr]:
        """A copy of ``node`` that reads only literals and ``args.<flag>``; None when that is impossible."""
        if node is None or depth > _MAX_DEPTH:
            return None
        flag = self.flag_of(node)
        if flag is not None:
            return ast.Attribute(value=ast.Name(id="args", ctx=ast.Load()), attr=flag, ctx=ast.Load())
        if isinstance(node, ast.Constant):
            return copy.deepcopy(node)
        if isinstance(node, ast.Name):
            if node.id in ("True", "False", "None"):
                return copy.deepcopy(node)
            value = self.assigned(node.id)
            return self.portable(value, depth + 1) if value is not None else None
        if isinstance(node, ast.JoinedStr):
            parts = [self.portable(v, depth + 1) if isinstance(v, ast.FormattedValue) else v for v in node.values]
            return None if any(p is None for p in parts) else ast.JoinedStr(values=parts)
        if isinstance(node, ast.FormattedValue):
            value = self.portable(node.value, depth + 1)
            return None if value is None else ast.FormattedValue(value=value, conversion=node.conversion,
                                                                 format_spec=node.format_spec)
        children = self._portable_children(node, depth)
        if children is None:
            return None
        out = copy.copy(node)
        for field_name, value in children.items():
            setattr(out, field_name, value)
        return out

    def _portable_children(self, node: ast.expr, depth: int) -> Optional[Dict[str, object]]:
        """The portable children of an operator, container or pure-builtin call; None when any is not."""
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _PURE_BUILTINS) or node.keywords:
                return None
            fields = {"args": node.args}
        elif isinstance(node, ast.BinOp):
            fields = {"left": node.left, "right": node.right}
        elif isinstance(node, ast.UnaryOp):
            fields = {"operand": node.operand}
        elif isinstance(node, ast.BoolOp):
            fields = {"values": node.values}
        elif isinstance(node, ast.Compare):
            fields = {"left": node.left, "comparators": node.comparators}
        elif isinstance(node, ast.IfExp):
            fields = {"test": node.test, "body": node.body, "orelse": node.orelse}
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            fields = {"elts": node.elts}
        elif isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                return None
            fields = {"keys": node.keys, "values": node.values}
        else:
            return None
        out: Dict[str, object] = {}
        for name, value in fields.items():
            if isinstance(value, list):
                items = [self.portable(v, depth + 1) for v in value]
                if any(v is None for v in items):
                    return None
                out[name] = items
            else:
                item = self.portable(value, depth + 1)
                if item is None:
                    return None
                out[name] = item
        if isinstance(node, ast.Call):
            out["func"] = ast.Name(id=node.func.id, ctx=ast.Load())
        return out

    def count(self, iterable: ast.expr, depth: int = 0) -> Optional[ast.expr]:
        """How many items a loop over ``iterable`` yields, as a portable expression (None: unknown).

        Understands ``range(n)``, ``enumerate(x)``, list/tuple literals, list comprehensions with one unfiltered
        generator, and names bound to any of these.
        """
        if depth > _MAX_DEPTH:
            return None
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and not iterable.keywords:
            if iterable.func.id == "range" and len(iterable.args) == 1:
                return self.portable(iterable.args[0])
            if iterable.func.id == "enumerate" and len(iterable.args) == 1:
                return self.count(iterable.args[0], depth + 1)
            return None
        if isinstance(iterable, (ast.List, ast.Tuple)):
            return ast.Constant(value=len(iterable.elts))
        if isinstance(iterable, ast.ListComp) and len(iterable.generators) == 1 and not iterable.generators[0].ifs:
            return self.count(iterable.generators[0].iter, depth + 1)
        if isinstance(iterable, ast.Name):
            value = self.assigned(iterable.id)
            return self.count(value, depth + 1) if value is not None else None
        return None


def portable_flag_call(call: ast.Call) -> Tuple[ast.Call, List[str]]:
    """An ``add_argument`` call that can be re-emitted as is; keywords that cannot (``type=my_fn``) are dropped.

    Returns the cleaned call and the names of the dropped keywords.
    """
    dropped = []
    keywords = []
    for kw in call.keywords:
        ok = kw.arg is not None and (literal(kw.value)[0] or (kw.arg == "type" and isinstance(kw.value, ast.Name)
                                                              and kw.value.id in _TYPE_NAMES))
        if ok:
            keywords.append(kw)
        else:
            dropped.append(kw.arg or "**")
    clean = ast.Call(func=ast.Attribute(value=ast.Name(id="parser", ctx=ast.Load()), attr="add_argument",
                                        ctx=ast.Load()), args=[a for a in call.args if literal(a)[0]],
                     keywords=keywords)
    return clean, dropped


def args_refs(code: str) -> Set[str]:
    """Flags a piece of generated code reads (``args.<flag>``)."""
    out = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
            out.add(node.attr)
    return out


def evaluate(node: ast.expr, args: object) -> object:
    """The value of a *portable* expression for the parsed arguments ``args`` (e.g. the legacy defaults).

    Only portable expressions (see `Resolver.portable`) may be passed: they hold nothing but literals, ``args``
    attributes, operators and pure builtins.
    """
    pure = {name: getattr(builtins, name) for name in _PURE_BUILTINS}
    code = compile(ast.fix_missing_locations(ast.Expression(body=node)), "<legacy expression>", "eval")
    return eval(code, {"__builtins__": pure}, {"args": args})  # noqa: S307 - portable expressions only
