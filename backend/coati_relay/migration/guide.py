"""The migration guide as installed with the package: ``coati-relay docs [TOPIC]``.

The pages are the repository's ``migration_guide/*.md``, their one copy: a checkout (an editable install, or the
source roots on ``PYTHONPATH``) reads them there, and a built wheel holds them beside this module, in ``pages/``
(``setup.py`` copies them in when it builds). A TOPIC is a page's name (``rewriter``, ``api_map``, ...) or an anchor
of a page (``<a id="four-role"></a>``, the topics that the NOTEs of a migrated script name): the page, or that
anchor's section, is printed.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

_HERE = Path(__file__).resolve().parent
# A wheel's copy beside this module, else the checkout's migration_guide/ (backend/coati_relay/migration -> the root).
PAGES = next((d for d in (_HERE / "pages", _HERE.parents[2] / "migration_guide") if d.is_dir()), _HERE / "pages")
_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
_HEADING = re.compile(r"^(#+) ")


def pages() -> Dict[str, Path]:
    """Page name (file stem) -> file."""
    if not PAGES.is_dir():
        raise FileNotFoundError(f"the migration guide is not installed at {PAGES}; reinstall coati-relay")
    return {p.stem: p for p in sorted(PAGES.glob("*.md"))}


def anchors() -> Dict[str, str]:
    """Anchor -> the name of the page that holds it."""
    return {a: name for name, path in pages().items() for a in _ANCHOR.findall(path.read_text(encoding="utf-8"))}


def section(lines: List[str], anchor: str) -> str:
    """The lines from ``anchor``'s line to the next anchor or the next heading of the same or a higher level."""
    start = next(i for i, line in enumerate(lines) if f'<a id="{anchor}"></a>' in line)
    level = None
    for i in range(start + 1, len(lines)):
        heading = _HEADING.match(lines[i])
        if _ANCHOR.search(lines[i]) or (heading and level is not None and len(heading.group(1)) <= level):
            return "\n".join(lines[start + 1:i]).strip() + "\n"
        if heading and level is None:
            level = len(heading.group(1))
    return "\n".join(lines[start + 1:]).strip() + "\n"


def read(topic: str) -> str:
    """The text of page or anchor ``topic``; ValueError naming the pages and anchors when there is none."""
    found = pages()
    if topic in found:
        return found[topic].read_text(encoding="utf-8")
    where = anchors()
    if topic in where:
        text = found[where[topic]].read_text(encoding="utf-8")
        return f"({where[topic]}.md#{topic})\n\n" + section(text.splitlines(), topic)
    raise ValueError(f"no guide page or topic {topic!r}; pages: {', '.join(found)}; run `coati-relay docs` for "
                     f"the topics")


def index() -> str:
    """The pages, each with its title, and the topics of each page."""
    out = ["The migration guide (`coati-relay docs PAGE` prints a page, `coati-relay docs TOPIC` a section):", ""]
    where = anchors()
    for name, path in pages().items():
        title = next((line.lstrip("# ").strip() for line in path.read_text(encoding="utf-8").splitlines()
                      if line.startswith("# ")), "")
        out.append(f"  {name:24} {title}")
        topics = [a for a, page in where.items() if page == name]
        if topics and len(topics) <= 40:
            out.append(f"  {'':24} topics: {', '.join(topics)}")
        elif topics:
            out.append(f"  {'':24} {len(topics)} topics, e.g. {', '.join(topics[:5])}")
    return "\n".join(out) + "\n"
