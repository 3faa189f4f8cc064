"""The docs site (mkdocs.yml, docs/) builds with `mkdocs build --strict`: a broken
link between pages, a link to a heading that does not exist or a page left out of
the navigation fails it (mkdocs.yml's `validation` turns each into a warning, and
--strict makes a warning fatal). Built once, into a temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.docs.walk import DOCS, ROOT

CONFIG = ROOT / "mkdocs.yml"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(CONFIG),
         "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's notice about its future
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for page in DOCS.rglob("*.md"):
        built = page.relative_to(DOCS).with_suffix("")
        index = site / ("index.html" if built.name == "index" else built / "index.html")
        assert index.exists(), f"{page} was not built"


def test_the_site_checks_links_and_anchors_and_lists_every_page() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert config["docs_dir"] == "docs"
    assert config["validation"]["links"] == {
        "not_found": "warn",
        "anchors": "warn",
        "unrecognized_links": "warn",
        "absolute_links": "warn",
    }
    assert config["validation"]["nav"]["omitted_files"] == "warn"
    listed = _pages(config["nav"])
    assert listed == {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}


def _pages(nav: object) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return {page for item in nav for page in _pages(item)}
    if isinstance(nav, dict):
        return {page for value in nav.values() for page in _pages(value)}
    return set()
