"""User code named by import path: ``"module:name"`` or ``"path/to/file.py:name"`` where a config takes a name
(``grpo_config['reward_fn']``, ``policy_loss``, ``value_loss``, ``kl_estimator``, each of ``callbacks``), and
modules imported for what they register (``coati-relay run --import``).

A module is imported as Python imports it (``sys.path``); a ``.py`` file is loaded under its file name (``rewards.py``
as module ``rewards``). What is resolved here travels to the actors by value (`coati_relay.config.user_code`), so
they need neither the module nor the file.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

from coati_relay.config.keys import closest

log = logging.getLogger(__name__)


class ImportPathError(ValueError):
    """A module or a name of an import path cannot be imported; the message names it and says what to do."""


def is_import_path(value: Any) -> bool:
    """True for a str of the form ``MODULE:NAME`` or ``FILE.py:NAME``."""
    if not isinstance(value, str):
        return False
    module, sep, name = value.rpartition(":")
    return bool(sep and module and name) and "://" not in value


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _load_file(spec: str) -> ModuleType:
    path = Path(spec).expanduser().resolve()
    if not path.is_file():
        raise ImportPathError(f"{spec!r} is no file; give an existing .py file or a module name")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == path:
            return loaded
        raise ImportPathError(f"{spec!r} would be imported as module {name!r}, which is imported already (from "
                              f"{getattr(loaded, '__file__', 'built in')}); rename the file")
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportPathError(f"{spec!r} cannot be imported as Python source; give a .py file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_user_module(spec: str) -> ModuleType:
    """The module ``spec`` names (``pkg.mod``) or the ``.py`` file it is the path of, imported; an import that fails
    raises `ImportPathError` naming the module and the cause."""
    if not isinstance(spec, str) or not spec.strip():
        raise ImportPathError(f"an import needs a module name or a .py file, got {spec!r}")
    spec = spec.strip()
    try:
        if _is_file(spec):
            module = _load_file(spec)
        else:
            module = importlib.import_module(spec)
    except ImportPathError:
        raise
    except ModuleNotFoundError as exc:
        missing = exc.name or spec
        where = ("" if missing != spec.split(".")[0] else
                 f"; run from the folder that holds {missing}.py, add its folder to PYTHONPATH, or give the file's "
                 f"path (path/to/{spec.split('.')[-1]}.py)")
        raise ImportPathError(f"cannot import module {spec!r}: no module named {missing!r}{where}") from exc
    except Exception as exc:
        raise ImportPathError(f"importing {spec!r} raised {type(exc).__name__}: {exc}; fix the module") from exc
    log.debug("imported user module %s from %s", module.__name__, getattr(module, "__file__", None))
    return module


def resolve_import_path(path: str) -> Any:
    """The object ``"MODULE:NAME"`` or ``"FILE.py:NAME"`` names (NAME may be dotted: ``Class.method``)."""
    spec, _, name = path.rpartition(":")
    module = import_user_module(spec)
    obj: Any = module
    for i, part in enumerate(name.split(".")):
        if not hasattr(obj, part):
            owner = ".".join([module.__name__] + name.split(".")[:i])
            public = [a for a in dir(obj) if not a.startswith("_")]
            raise ImportPathError(f"{path!r}: {owner} has no attribute {part!r}{closest(part, public)}")
        obj = getattr(obj, part)
    return obj


def resolve_reward(errors: List[str], key: str, value: Any) -> Any:
    """``grpo_config[key]`` given as an import path: the callable it names (None, with the error, where it is not
    one); any other value as it is."""
    if not is_import_path(value):
        return value
    try:
        fn = resolve_import_path(value)
    except ImportPathError as exc:
        errors.append(f"grpo_config[{key!r}]: {exc}")
        return None
    if not callable(fn):
        errors.append(f"grpo_config[{key!r}] = {value!r} is a {type(fn).__name__}, not a reward function "
                      f"fn(responses, gt_answers, prompts)")
        return None
    return fn


def register_algorithm_paths(errors: List[str], grpo: Dict[str, Any]) -> None:
    """Registers the function of each loss or KL setting of ``grpo`` given as an import path under that path, the
    name the run then looks it up by (and the actors, which get it by value)."""
    from coati_relay import algorithms
    from coati_relay.config.user_code import NAMED_BY

    for kind, setting in NAMED_BY.items():
        value = grpo.get(setting)
        if not is_import_path(value):
            continue
        try:
            fn = resolve_import_path(value)
        except ImportPathError as exc:
            errors.append(f"grpo_config[{setting!r}]: {exc}")
            continue
        if not callable(fn):
            errors.append(f"grpo_config[{setting!r}] = {value!r} is a {type(fn).__name__}, not a {kind} function")
            continue
        algorithms.register(kind, value)(fn)


def resolve_callbacks(errors: List[str], callbacks: Any) -> Any:
    """``callbacks`` with each import path replaced by what it names (a class by an instance of it, made without
    arguments); anything else as it is, for `coati_relay.config.callbacks.check_callbacks`."""
    if not isinstance(callbacks, (list, tuple)):
        return callbacks
    out = []
    for i, cb in enumerate(callbacks):
        if is_import_path(cb):
            try:
                cb = resolve_import_path(cb)
                if isinstance(cb, type):
                    cb = cb()
            except ImportPathError as exc:
                errors.append(f"callbacks[{i}]: {exc}")
                continue
            except TypeError as exc:
                errors.append(f"callbacks[{i}]: {callbacks[i]!r} is a class that needs arguments ({exc}); give "
                              f"an import path of an instance, or pass the object from Python")
                continue
        out.append(cb)
    return out
