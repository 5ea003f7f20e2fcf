"""What a config field means, declared beside the field: ``x: int = meaning(CC, "what x is", "launch_keyword")``.

Each field of `coati_relay.config.schema` carries a `Meaning`: its origin (``CC``: ColossalChat's meaning, kept;
``EXT``: this engine's extension) and the launch keywords or config keys that set it (``"num_producers"``,
``"grpo_config['lr']"``). A section that one keyword sets whole (``generate_config``: `SamplingConfig`) says so with
`section`. `coati_relay.config.launch_keywords` makes ``help(launch_distributed)`` from these.
"""
from __future__ import annotations

from dataclasses import MISSING, field, fields
from typing import Any, Dict, NamedTuple, Optional, Tuple

from coati_relay.config.checks import Check

CC, EXT = "ColossalChat", "extension"


class Meaning(NamedTuple):
    """origin: CC or EXT; text: the meaning; keys: the launch keywords and config keys that set it (none: the engine
    derives it)."""

    origin: str
    text: str
    keys: Tuple[str, ...] = ()


def meaning(origin: str, text: str, *keys: str, default: Any = MISSING, default_factory: Any = MISSING,
            check: Optional[Check] = None, **field_args: Any) -> Any:
    """A `dataclasses.field` that carries its `Meaning` and, with ``check``, the `Check` of the key that sets it:
    the check's default is the field's unless it is a function of other keys."""
    metadata: Dict[str, Any] = {"meaning": Meaning(origin, text, keys)}
    if check is not None:
        metadata["check"] = check
        if default is MISSING and not callable(check.default):
            default = check.default
    return field(default=default, default_factory=default_factory, metadata=metadata, **field_args)


def field_checks(cls: type) -> Dict[str, Check]:
    """Field name -> its `Check`, in field order, for the fields of the dataclass ``cls`` that carry one."""
    return {f.name: f.metadata["check"] for f in fields(cls) if "check" in f.metadata}


def section(origin: str, text: str, *keys: str):
    """Class decorator: the meaning of a whole section (``keys``: the keyword that sets it)."""
    def mark(cls):
        cls.__meaning__ = Meaning(origin, text, keys)
        return cls
    return mark


def field_meanings(cls: type) -> Dict[str, Optional[Meaning]]:
    """Field name -> its `Meaning` (None where a field has none) for the dataclass ``cls``."""
    return {f.name: f.metadata.get("meaning") for f in fields(cls)}


def section_meaning(cls: type) -> Optional[Meaning]:
    """The meaning `section` gave ``cls`` itself, or None."""
    return cls.__dict__.get("__meaning__")


def default_of(cls: type, name: str) -> Any:
    """The default the dataclass ``cls`` declares for its field ``name`` (a default factory called)."""
    f = next(f for f in fields(cls) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default
