"""``coati-relay run --set key.sub=value``: dotted overrides of a run's keywords, applied to the YAML mapping before
the build checks it. A value is read as YAML (``1e-5`` a float as well, ``[a, b]`` a list, ``null`` None, ``true`` a
bool)."""
from __future__ import annotations

import copy
from typing import Any, Dict, Iterable


class OverrideError(ValueError):
    """An override is malformed or walks through a value that is not a mapping."""


def parse_value(text: str) -> Any:
    """The YAML reading of ``text`` (a plain string where YAML reads none); a number YAML 1.1 leaves as text
    (``1e-5``, which has no dot) is a float."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(kwargs: Dict[str, Any], overrides: Iterable[str]) -> Dict[str, Any]:
    """A copy of ``kwargs`` with each ``KEY.SUB=VALUE`` set; intermediate sections that are absent are created."""
    out = copy.deepcopy(kwargs)
    for item in overrides:
        path, sep, text = item.partition("=")
        keys = path.strip().split(".")
        if not sep or not all(keys):
            raise OverrideError(f"--set {item!r}: write KEY=VALUE or KEY.SUB=VALUE (e.g. --set grpo_config.lr=1e-5)")
        node = out
        for depth, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                where = ".".join(keys[:depth + 1])
                raise OverrideError(f"--set {item!r}: {where} is {child!r}, not a section, so it has no key "
                                    f"{keys[depth + 1]!r}")
            node = child
        node[keys[-1]] = parse_value(text)
    return out
