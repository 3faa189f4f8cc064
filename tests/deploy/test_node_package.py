"""The Node client as users get it: `npm pack` of the tracked files, installed with
`npm install <tarball>` into an empty project outside the checkout, and its
README's example run as written against real services."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.artefacts import ROOT, copy_tracked_tree, run, serve_all

NODE, NPM = shutil.which("node"), shutil.which("npm")
VERSION = (ROOT / "VERSION").read_text().strip()
README = ROOT / "clients" / "node" / "README.md"
REQUIRED = os.environ.get("CI", "").lower() in ("1", "true")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        (NODE is None or NPM is None) and not REQUIRED,
        reason="node and npm not on PATH: the Node package test needs Node.js 20+",
    ),
]


def _npm_environment() -> dict[str, str]:
    return {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false"}


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("node-package")
    tree = copy_tracked_tree(base / "tree")
    assert NPM is not None
    output = run(
        [NPM, "pack", "--json", "--pack-destination", base], cwd=tree / "clients" / "node",
        env=_npm_environment(),
    )  # fmt: skip
    (packed,) = json.loads(output[output.index("[") :])
    # postpack removed the copy again: a checkout reads ../../protos, never a stale copy.
    assert not (tree / "clients" / "node" / "protos" / "switchboard").exists()
    return base / str(packed["filename"])


def test_package_json_is_publishable_at_the_one_version() -> None:
    package = json.loads((ROOT / "clients" / "node" / "package.json").read_text())
    assert "private" not in package
    assert package["version"] == VERSION
    assert package["license"] and package["engines"]["node"]
    assert package["exports"]["."] == "./src/index.js"
    assert set(package["files"]) >= {"src/", "protos/"}


def test_the_tarball_carries_the_sources_and_every_proto(tarball: Path) -> None:
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
    protos = [path.relative_to(ROOT) for path in (ROOT / "protos").rglob("*.proto")]
    assert protos
    for proto in protos:
        assert f"package/{proto}" in names, f"{proto} is not in the tarball"
    for needed in ("package/src/index.js", "package/protos/google/rpc/status.proto"):
        assert needed in names
    assert not [name for name in names if name.startswith(("package/test/", "package/scripts/"))]


def readme_example() -> str:
    """The ```js block under the README's "## Example" heading, verbatim."""
    text = README.read_text()
    section = text[text.index("## Example") :]
    match = re.search(r"```js\n(.*?)```", section, re.DOTALL)
    assert match, "no js example in clients/node/README.md"
    return match.group(1)


@pytest.fixture(scope="module")
def project(tarball: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty project with nothing but the tarball installed (deps from the registry)."""
    directory = tmp_path_factory.mktemp("empty-project")
    assert NPM is not None
    run([NPM, "install", "--no-audit", tarball], cwd=directory, env=_npm_environment(), timeout=300)
    return directory


@pytest.fixture
def services(tmp_path: Path) -> Iterator[dict[str, str]]:
    with serve_all(Path(sys.executable).parent / "switchboard", tmp_path) as server:
        yield server.addresses
        assert server.terminate() == 0


def test_the_installed_package_reads_its_own_protos(project: Path) -> None:
    assert NODE is not None
    where = run(
        [NODE, "--input-type=module", "-e",
         "import { DEFAULT_PROTO_DIR } from '@switchboard/client'; console.log(DEFAULT_PROTO_DIR)"],
        cwd=project,
    ).strip()  # fmt: skip
    assert Path(where) == project / "node_modules" / "@switchboard" / "client" / "protos"


def test_the_readme_example_runs_as_written_and_exits(
    project: Path, services: dict[str, str]
) -> None:
    assert NODE is not None
    example = project / "example.mjs"
    example.write_text(readme_example())
    environment = {
        **os.environ,
        "SWITCHBOARD_SESSION_ADDRESS": services["SessionService"],
        "SWITCHBOARD_DELIVERY_ADDRESS": services["DeliveryService"],
    }
    environment.pop("SWITCHBOARD_PROTO_DIR", None)
    for attempt in ("first", "second"):  # a second run must not trip over the first's agent
        result = subprocess.run(
            [NODE, example], cwd=project, env=environment, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"{attempt} run:\n{result.stdout}\n{result.stderr}"
        assert re.search(r"example-\w+: session \S+, reply \w+ delivered", result.stdout)
