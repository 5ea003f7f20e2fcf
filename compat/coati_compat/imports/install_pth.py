"""Writes ``coati_relay_legacy.pth`` into a site-packages directory, so that every interpreter of that environment
serves the legacy ``coati`` paths (``python -m coati_compat.imports.install_pth [--site-dir DIR]``).

The line runs `coati_compat.imports.startup` only when ``coati_compat`` is importable, and never imports torch.
"""
from __future__ import annotations

import argparse
import logging
import os
import sysconfig
from pathlib import Path
from typing import List, Optional

PTH_NAME = "coati_relay_legacy.pth"
PTH_LINE = ('import importlib.util; importlib.util.find_spec("coati_compat") is not None and '
            '__import__("coati_compat.imports.startup").imports.startup.run()\n')

logger = logging.getLogger(__name__)


def write_pth(site_dir: Optional[str] = None) -> Path:
    """Writes the ``.pth`` file into ``site_dir`` (default: this interpreter's purelib) and returns its path."""
    directory = Path(site_dir if site_dir is not None else sysconfig.get_paths()["purelib"])
    if not directory.is_dir():
        raise ValueError(f"site directory {str(directory)!r} does not exist; pass an existing site-packages dir")
    path = directory / PTH_NAME
    tmp = path.with_suffix(".pth.tmp")
    tmp.write_text(PTH_LINE)
    os.replace(tmp, path)
    logger.info("wrote %s", path)
    return path


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site-dir", default=None, help="site-packages directory (default: this interpreter's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_pth(args.site_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
