"""Every keyword of `launch_distributed` with its meaning, read from the schema's fields
(`coati_relay.config.schema`, `coati_relay.config.meaning`): `launch_distributed`'s docstring is made from it
(`keywords_doc`), and a test holds `LAUNCH_KEYWORDS` to `build_run_config`'s signature.

A keyword's meaning is that of the section it sets whole, or of the field it sets, followed by one item per key of
it that sets a field (``'path': ...``), each on a line of its own. ``(ColossalChat)`` marks ColossalChat's meaning,
kept; ``(extension)`` one only this engine has.
"""
from __future__ import annotations

import inspect
import textwrap
from typing import Dict, Iterable, List, Mapping, Tuple

from coati_relay.config.keys import IGNORED_LAUNCH_KEYS
from coati_relay.config.meaning import Meaning, field_meanings, section_meaning
from coati_relay.config.schema import SECTIONS

# Every section's and every field's `Meaning`, in the order of `SECTIONS` (read once: the schema does not change).
MEANINGS: Tuple[Meaning, ...] = tuple(m for cls in SECTIONS
                                      for m in (section_meaning(cls), *field_meanings(cls).values()) if m)


def _item(key: str, keyword: str) -> str:
    """``'path'`` for ``train_model_config['path']``; ``other keys`` for ``train_model_config[...]``."""
    sub = key[len(keyword) + 1:-1]
    return "other keys" if sub == "..." else sub


def keyword_meaning(keyword: str) -> Tuple[str, str]:
    """(origin, meaning) of one launch keyword, the meaning's items (one per key) on lines of their own; KeyError
    where the schema gives the keyword none."""
    whole = [m for m in MEANINGS if keyword in m.keys]
    parts = [m for m in MEANINGS if m not in whole and any(k.startswith(keyword + "[") for k in m.keys)]
    if not whole and not parts:
        raise KeyError(f"no field of coati_relay.config.schema says what launch keyword {keyword!r} means")
    origin = (whole or parts)[0].origin
    items = []
    for m in parts:
        keys = ", ".join(_item(k, keyword) for k in m.keys if k.startswith(keyword + "["))
        if not m.keys[0].startswith(keyword + "["):  # said where its first key is
            items.append(f"{keys}: as {m.keys[0]}")
        else:
            items.append(f"{keys}{'' if m.origin == origin else f' ({m.origin})'}: {m.text}")
    return origin, "\n".join(["; ".join(m.text for m in whole), *items])


def config_keys(keyword: str) -> List[str]:
    """The keys of the config dict ``keyword`` that set a field (``grpo_config``: ``['lr', ...]``)."""
    return [_item(k, keyword).strip("'") for m in MEANINGS for k in m.keys
            if k.startswith(keyword + "[") and not k.endswith("[...]")]


def _keywords() -> List[str]:
    """Every launch keyword the schema names, in the order of its fields."""
    names: Dict[str, None] = {}
    for m in MEANINGS:
        names.update(dict.fromkeys(k.split("[", 1)[0] for k in m.keys))
    return list(names)


# keyword -> (origin, meaning): those of `coati_relay.launch.launch_distributed` (the zero-bubble entry's own
# keyword, which that entry ignores, left out).
LAUNCH_KEYWORDS: Dict[str, Tuple[str, str]] = {k: keyword_meaning(k) for k in _keywords()
                                               if k not in IGNORED_LAUNCH_KEYS}


def keywords_doc(head: str, keywords: Iterable[str], ignored: Mapping[str, str], width: int = 116,
                 overrides: Mapping[str, Tuple[str, str]] = None) -> str:
    """``head`` followed by one paragraph per keyword of ``keywords`` and one per ColossalChat keyword accepted
    without effect (``ignored``). ``overrides``: keyword -> (origin, meaning) replacing the schema's."""
    lines = [inspect.cleandoc(head), "", "Keywords:"]
    for name in keywords:
        origin, text = (overrides or {}).get(name) or LAUNCH_KEYWORDS.get(name) or keyword_meaning(name)
        head, *items = text.split("\n")
        lines += textwrap.wrap(f"{name} ({origin}): {head}" + ("." if head else ""), width=width,
                               initial_indent="    ", subsequent_indent="        ")
        for item in items:
            lines += textwrap.wrap(f"{item}.", width=width, initial_indent="        ",
                                   subsequent_indent="            ")
    lines += ["", "Accepted for ColossalChat scripts, without effect here (each warns once):"]
    for name, reason in ignored.items():
        lines += textwrap.wrap(f"{name}: {reason}.", width=width, initial_indent="    ",
                               subsequent_indent="        ")
    return "\n".join(lines) + "\n"
