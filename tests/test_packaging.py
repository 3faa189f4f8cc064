"""The distributions' metadata agrees with the tree: every top-level package is shipped,
and the one version (VERSION) is the one both distributions, the server's pin on the
client, the CHANGELOG and the manifests' image name carry. (tests/deploy builds and
installs the wheels for real.)"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VERSION = (ROOT / "VERSION").read_text().strip()
NOT_SHIPPED = {"tests", "bench"}


def _pyproject(path: Path) -> Any:
    return tomllib.loads(path.read_text())


def test_the_server_wheel_lists_every_top_level_package() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*/__init__.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    top_level = {name.split("/")[0] for name in tracked if name.count("/") == 1}
    wheel = _pyproject(ROOT / "pyproject.toml")["tool"]["hatch"]["build"]["targets"]["wheel"]
    packages = wheel["packages"]
    assert sorted(top_level - NOT_SHIPPED) == sorted(packages)


def test_the_image_builds_the_wheel_from_every_package_it_lists() -> None:
    """The Dockerfile copies the tree package by package: one left out is silently
    missing from the image's wheel."""
    wheel = _pyproject(ROOT / "pyproject.toml")["tool"]["hatch"]["build"]["targets"]["wheel"]
    copied = re.findall(r"^COPY (\S+) \./\1$", (ROOT / "k8s" / "Dockerfile").read_text(), re.M)
    assert sorted(set(wheel["packages"]) - set(copied)) == []


def test_one_version_everywhere() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    for path in (ROOT / "pyproject.toml", ROOT / "clients" / "python" / "pyproject.toml"):
        project = _pyproject(path)
        assert project["project"]["dynamic"] == ["version"], path
        source = path.parent / project["tool"]["hatch"]["version"]["path"]
        assert source.resolve() == (ROOT / "VERSION").resolve(), path
    dependencies = _pyproject(ROOT / "pyproject.toml")["project"]["dependencies"]
    assert f"switchboard-client=={VERSION}" in dependencies, "pin the client at VERSION"
    assert f"## {VERSION}" in (ROOT / "CHANGELOG.md").read_text(), "CHANGELOG.md has no entry"
