"""One build step beyond pyproject.toml: the migration guide ships inside the package.

``migration_guide/*.md`` (the repository's one copy of the guide) is copied at build time to
``coati_relay/migration/pages/``, where ``coati-relay docs`` reads it in an installed wheel; an sdist carries
``migration_guide/`` too. An editable install and a checkout read ``migration_guide/`` itself
(`coati_relay.migration.guide`).
"""
import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

GUIDE = "migration_guide"
PAGES = ("coati_relay", "migration", "pages")


class BuildPyWithGuide(build_py):
    """build_py whose package data also holds the guide's pages: the wheel gets them (its RECORD lists them), and so
    does the sdist (whose file list setuptools takes from `get_data_files_without_manifest`)."""

    def _guide_pages(self):
        """(package, source dir, build dir, file names): one entry of build_py's ``data_files``."""
        pages = sorted(p.name for p in Path(GUIDE).glob("*.md"))
        if not pages:
            raise FileNotFoundError(f"no pages in {GUIDE}/: build from the repository's root")
        return ".".join(PAGES), GUIDE, os.path.join(self.build_lib, *PAGES), pages

    def _get_data_files(self):
        return super()._get_data_files() + [self._guide_pages()]

    def get_data_files_without_manifest(self):
        return super().get_data_files_without_manifest() + [self._guide_pages()]


setup(cmdclass={"build_py": BuildPyWithGuide})
