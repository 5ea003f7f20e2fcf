"""Reads a legacy ``coati.ray`` launch script with `ast` (it is never imported or run) and collects what it sets up.

What is found: the argparse options and their defaults; the ``ExperienceMakerHolder`` and trainer actors created
with ``.options(...).remote(...)`` (their arguments by parameter name, and how many each call site creates); the
``workingloop``/``fit``/``sync_models_to_remote_makers`` calls; the model factories inside each ``model_fn``; the
prompt source, prompt length and data-loader batch size; user subclasses of the legacy classes.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set, Union

from coati_compat.migrate.expressions import Resolver, call_name, keyword_map, literal

MAKER_CLASSES = {"ExperienceMakerHolder"}
TRAINER_CLASSES = {"DetachedPPOTrainer", "DetachedTrainer"}
CALLBACK_CLASSES = {"TrainerCallback", "MakerCallback"}
MAKER_PARAMS = ("detached_trainer_name_list", "strategy_fn", "model_fn", "env_info", "sync_models_from_trainers",
                "buffer_cpu_offload", "kl_coef", "callbacks", "eval_performance", "debug", "update_lora_weights")
PPO_TRAINER_PARAMS = ("experience_maker_holder_name_list", "strategy_fn", "model_fn", "env_info", "train_batch_size",
                      "buffer_limit", "eps_clip", "value_clip", "dataloader_pin_memory", "callbacks",
                      "eval_performance", "debug", "update_lora_weights")
METHOD_PARAMS = {"workingloop": ("dataloader_fn", "num_epochs", "num_steps"),
                 "fit": ("total_steps", "update_steps", "train_epochs"),
                 "sync_models_to_remote_makers": ()}
BASE_TRAINER_PARAMS = ("experience_maker_holder_name_list", "train_batch_size", "buffer_limit",
                       "dataloader_pin_memory", "callbacks", "debug")
_INHERITED_PARAMS = {"ExperienceMakerHolder": MAKER_PARAMS, "DetachedPPOTrainer": PPO_TRAINER_PARAMS,
                     "DetachedTrainer": BASE_TRAINER_PARAMS, "TrainerCallback": (), "MakerCallback": ()}
MAKER_ROLES = ("actor", "critic", "reward_model", "initial_model")
TRAINER_ROLES = ("actor", "critic")
_FACTORIES = {"get_actor_from_args": "actor", "get_critic_from_args": "critic",
              "get_reward_model_from_args": "reward_model"}
_FAMILY_PREFIXES = {"GPT": "gpt2", "BLOOM": "bloom", "OPT": "opt", "Llama": "llama"}
_FAMILY_SUFFIXES = {"Actor": "actor", "Critic": "critic", "RM": "reward_model"}


@dataclass
class Flag:
    """One argparse option. ``call`` is the ``add_argument`` call as written; ``default`` its literal default."""

    dest: str
    call: ast.Call
    default: object
    line: int


@dataclass
class ActorCall:
    """One call site creating legacy actors: ``Cls.options(**options).remote(**kwargs)``.

    count: how many actors the site creates (portable expression; None when the loop could not be read).
    """

    role: str  # "maker" | "trainer"
    class_name: str
    line: int
    kwargs: Dict[str, ast.expr]
    options: Dict[str, ast.expr]
    count: Optional[ast.expr]


@dataclass
class MethodCall:
    method: str  # "workingloop" | "fit" | "sync_models_to_remote_makers"
    line: int
    kwargs: Dict[str, ast.expr]


@dataclass
class ModelRef:
    """A model a ``model_fn`` builds. ``path``: where its weights (or, with ``from_config``, only its shape)
    come from, as a portable expression or None."""

    role: str
    factory: str
    line: int
    path: Optional[ast.expr]
    from_config: bool = False
    family: Optional[ast.expr] = None
    lora_rank: Optional[ast.expr] = None


@dataclass
class CustomClass:
    """A user subclass of a legacy class. kind: "trainer" | "maker" | "callback"."""

    name: str
    kind: str
    base: str
    line: int
    methods: List[str]
    init_params: List[str]


@dataclass
class ModelFn:
    """What one ``model_fn`` builds, by role, and whether it loads a quantized model."""

    line: int
    models: Dict[str, ModelRef] = field(default_factory=dict)
    quantized: bool = False
    unread: List[str] = field(default_factory=list)


@dataclass
class LegacyScript:
    name: str
    tree: ast.Module
    resolver: Resolver
    flags: Dict[str, Flag]
    makers: List[ActorCall]
    trainers: List[ActorCall]
    calls: List[MethodCall]
    custom_classes: List[CustomClass]
    maker_models: Optional[ModelFn]
    trainer_models: Optional[ModelFn]
    prompt_path: Optional[ast.expr]
    prompt_path_line: int
    prompt_tokens: Optional[ast.expr]
    random_prompts: bool
    loader_batch_size: Optional[ast.expr]
    sets_pad_token: bool
    ray_init_line: int
    uses_receivers: bool

    def method_calls(self, method: str) -> List[MethodCall]:
        return [c for c in self.calls if c.method == method]


def _parents(tree: ast.AST) -> Dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _flags(tree: ast.Module) -> Dict[str, Flag]:
    flags: Dict[str, Flag] = {}
    for node in ast.walk(tree):
        if call_name(node) != "add_argument" or not node.args:
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        kws = keyword_map(node)
        ok, dest = literal(kws.get("dest"))
        if not ok:
            long = [n for n in names if n.startswith("--")] or names
            if not long:
                continue
            dest = long[0].lstrip("-").replace("-", "_")
        ok, default = literal(kws.get("default"))
        if not ok:
            action = literal(kws.get("action"))[1]
            default = {"store_true": False, "store_false": True}.get(action)
        flags[dest] = Flag(dest=dest, call=node, default=default, line=node.lineno)
    return flags


def _args_names(tree: ast.Module) -> Set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and call_name(node.value) in ("parse_args", "parse_known_args"):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
    return names


def _class_name(node: ast.expr) -> Optional[str]:
    """``Cls`` of ``Cls.remote(...)`` or ``Cls.options(...).remote(...)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "remote"):
        return None
    target = node.func.value
    if call_name(target) == "options":
        target = target.func.value
    return target.id if isinstance(target, ast.Name) else (target.attr if isinstance(target, ast.Attribute) else None)


def _site_count(node: ast.AST, parents: Dict[ast.AST, ast.AST], resolver: Resolver) -> Optional[ast.expr]:
    """How many times the call ``node`` runs: the product of its enclosing comprehensions and for loops."""
    factors: List[Optional[ast.expr]] = []
    child, parent = node, parents.get(node)
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        if isinstance(parent, (ast.ListComp, ast.GeneratorExp, ast.SetComp)) and child is parent.elt:
            factors += [None if g.ifs else resolver.count(g.iter) for g in parent.generators]
        elif isinstance(parent, ast.For) and child in parent.body:
            factors.append(resolver.count(parent.iter))
        elif isinstance(parent, (ast.While, ast.AsyncFor)):
            factors.append(None)
        child, parent = parent, parents.get(parent)
    if any(f is None for f in factors):
        return None
    total: ast.expr = ast.Constant(value=1)
    for f in factors:
        total = f if isinstance(total, ast.Constant) and total.value == 1 else ast.BinOp(total, ast.Mult(), f)
    return total


def _custom_classes(tree: ast.Module) -> List[CustomClass]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
        for base in bases:
            kind = ("trainer" if base in TRAINER_CLASSES else "maker" if base in MAKER_CLASSES
                    else "callback" if base in CALLBACK_CLASSES else None)
            if kind is None:
                continue
            methods = [f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            params = [a.arg for a in init.args.args[1:]] if init else list(_INHERITED_PARAMS[base])
            out.append(CustomClass(node.name, kind, base, node.lineno, methods, params))
            break
    return out


def _functions(tree: ast.Module) -> Dict[str, List[ast.FunctionDef]]:
    out: Dict[str, List[ast.FunctionDef]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            out.setdefault(node.name, []).append(node)
    return out


def _factory_call(node: Optional[ast.expr]) -> Optional[ast.Call]:
    """The model-building call inside a chain like ``get_actor_from_args(...).half().cuda()``."""
    while isinstance(node, ast.Call):
        name = call_name(node)
        if name in _FACTORIES or name == "from_pretrained" or _family_class(name):
            return node
        node = node.func.value if isinstance(node.func, ast.Attribute) else None
    return None


def _family_class(name: Optional[str]):
    """("llama", "actor") for ``LlamaActor``; None for other names."""
    for prefix, family in _FAMILY_PREFIXES.items():
        for suffix, role in _FAMILY_SUFFIXES.items():
            if name == prefix + suffix:
                return family, role
    return None


def _model_ref(call: ast.Call, role: str, local: Dict[str, ast.expr], resolver: Resolver) -> ModelRef:
    name = call_name(call)
    if name == "from_pretrained":
        path = call.args[0] if call.args else keyword_map(call).get("pretrained_model_name_or_path")
        return ModelRef(role, name, call.lineno, resolver.portable(path))
    fam = _family_class(name)
    kws = keyword_map(call, ("pretrained", "config", "checkpoint", "lora_rank") if fam else
                      ("model", "pretrained", "config", "lora_rank"))
    family = ast.Constant(value=fam[0]) if fam else resolver.portable(kws.get("model"))
    ref = ModelRef(role, name, call.lineno, resolver.portable(kws.get("pretrained")), family=family,
                   lora_rank=resolver.portable(kws.get("lora_rank")))
    if ref.path is None and "config" in kws:
        cfg = kws["config"]
        if isinstance(cfg, ast.Name):
            cfg = local.get(cfg.id, resolver.assigned(cfg.id))
        if call_name(cfg) == "from_pretrained" and cfg.args:
            ref.path, ref.from_config = resolver.portable(cfg.args[0]), True
    return ref


def _model_fn(node: Optional[ast.expr], roles, functions, resolver: Resolver) -> Optional[ModelFn]:
    """Reads the function passed as ``model_fn``: which model each returned slot is and where it comes from."""
    if call_name(node) == "partial" and node.args:
        node = node.args[0]
    if isinstance(node, ast.Name) and node.id in functions:
        fn = functions[node.id][-1]
        body_nodes = list(ast.walk(fn))
        returns = [n.value for n in body_nodes if isinstance(n, ast.Return) and n.value is not None]
        returned = returns[-1] if returns else None
    elif isinstance(node, ast.Lambda):
        body_nodes, returned = list(ast.walk(node)), node.body
    else:
        return None
    out = ModelFn(line=getattr(node, "lineno", 0))
    out.quantized = any(call_name(n) == "llama_load_quant" for n in body_nodes)
    local: Dict[str, ast.expr] = {}
    assigns = sorted((n for n in body_nodes if isinstance(n, ast.Assign)), key=lambda n: (n.lineno, n.col_offset))
    for n in assigns:  # source order: a later assignment (an else branch) wins over an earlier one
        if len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            if _factory_call(n.value) is not None or call_name(n.value) == "from_pretrained":
                local[n.targets[0].id] = n.value
    slots = returned.elts if isinstance(returned, ast.Tuple) else [returned] if returned is not None else []
    for role, slot in zip(roles, slots):
        value = local.get(slot.id, resolver.assigned(slot.id)) if isinstance(slot, ast.Name) else slot
        call = _factory_call(value)
        if call is None:
            out.unread.append(role)
            continue
        out.models[role] = _model_ref(call, role, local, resolver)
    if not slots:
        out.unread.extend(roles)
    return out


def _call_site(node: ast.Call, role: str, cls: str, params, parents, resolver: Resolver) -> ActorCall:
    target = node.func.value
    options = keyword_map(target) if call_name(target) == "options" else {}
    return ActorCall(role, cls, node.lineno, keyword_map(node, params), options,
                     _site_count(node, parents, resolver))


def nothing_to_migrate(name: str) -> str:
    return (f"{name} creates no ExperienceMakerHolder or DetachedTrainer actors (Cls.options(...).remote(...) or "
            f"Cls.remote(...)) and defines no four-role PPO actors (@ray.remote classes with coati.models.loss."
            f"PolicyLoss); there is nothing to migrate")


def analyze_source(text: str, name: str = "<script>", require_actors: bool = True) -> LegacyScript:
    """Analyzes the source of a legacy launch script. Raises ValueError when it is not Python or, with
    ``require_actors``, uses no legacy actors at all (nothing to migrate)."""
    try:
        tree = ast.parse(text, filename=name)
    except SyntaxError as exc:
        raise ValueError(f"{name} is not valid Python (line {exc.lineno}: {exc.msg}); the rewriter reads the "
                         f"script's syntax tree, so it must parse") from None
    flags = _flags(tree)
    resolver = Resolver(tree, set(flags), _args_names(tree))
    parents = _parents(tree)
    functions = _functions(tree)
    customs = _custom_classes(tree)
    trainer_classes = TRAINER_CLASSES | {c.name for c in customs if c.kind == "trainer"}
    maker_classes = MAKER_CLASSES | {c.name for c in customs if c.kind == "maker"}
    init_params = {c.name: tuple(c.init_params) for c in customs}
    makers, trainers, calls = [], [], []
    prompt_path, prompt_line, prompt_tokens, loader_batch = None, 0, None, None
    random_prompts = sets_pad = uses_receivers = False
    ray_init_line = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "pad_token"
                                                for t in node.targets):
            sets_pad = True
        if not isinstance(node, ast.Call):
            continue
        cls, func = _class_name(node), call_name(node)
        if cls in maker_classes:
            makers.append(_call_site(node, "maker", cls, init_params.get(cls, MAKER_PARAMS), parents, resolver))
        elif cls in trainer_classes:
            trainers.append(_call_site(node, "trainer", cls, init_params.get(cls, PPO_TRAINER_PARAMS), parents,
                                       resolver))
        elif (func == "remote" and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in METHOD_PARAMS):
            method = node.func.value.attr
            calls.append(MethodCall(method, node.lineno, keyword_map(node, METHOD_PARAMS[method])))
        elif func == "read_csv" and node.args and prompt_path is None:
            prompt_path, prompt_line = resolver.portable(node.args[0]), node.lineno
        elif func == "randint":
            random_prompts = True
            size = node.args[1] if len(node.args) > 1 else keyword_map(node).get("size")
            if isinstance(size, ast.Tuple) and size.elts and prompt_tokens is None:
                prompt_tokens = resolver.portable(size.elts[-1])
        elif func == "DataLoader" and loader_batch is None:
            loader_batch = resolver.portable(keyword_map(node, ("dataset", "batch_size")).get("batch_size"))
        elif func == "get_receivers_per_sender":
            uses_receivers = True
        elif func == "init" and isinstance(node.func, ast.Attribute) and getattr(node.func.value, "id", "") == "ray":
            ray_init_line = node.lineno
        kws = {kw.arg for kw in node.keywords}
        if "max_length" in kws and kws & {"padding", "truncation"} and prompt_tokens is None:
            prompt_tokens = resolver.portable(keyword_map(node)["max_length"])
    makers.sort(key=lambda c: c.line)
    trainers.sort(key=lambda c: c.line)
    calls.sort(key=lambda c: c.line)
    if require_actors and not makers and not trainers:
        raise ValueError(nothing_to_migrate(name))
    maker_models = _model_fn(makers[0].kwargs.get("model_fn"), MAKER_ROLES, functions, resolver) if makers else None
    trainer_models = (_model_fn(trainers[0].kwargs.get("model_fn"), TRAINER_ROLES, functions, resolver)
                      if trainers else None)
    return LegacyScript(
        name=name, tree=tree, resolver=resolver, flags=flags, makers=makers, trainers=trainers, calls=calls,
        custom_classes=customs, maker_models=maker_models, trainer_models=trainer_models, prompt_path=prompt_path,
        prompt_path_line=prompt_line, prompt_tokens=prompt_tokens, random_prompts=random_prompts,
        loader_batch_size=loader_batch, sets_pad_token=sets_pad, ray_init_line=ray_init_line,
        uses_receivers=uses_receivers)


def analyze_file(path: Union[str, Path]) -> LegacyScript:
    """Analyzes the legacy script at ``path`` (read as UTF-8, never executed)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"legacy script {path} does not exist; pass the path of a .py launch script")
    return analyze_source(path.read_text(encoding="utf-8"), name=path.name)
