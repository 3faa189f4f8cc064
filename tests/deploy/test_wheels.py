"""The wheels users install, tested installed: built from the tracked files only, put
into fresh venvs outside the checkout (one with only the client, one with the server),
run from an empty directory, and the client-side suite run against them.

The editable install in .venv hid a wheel without `session_service` once; these tests
fail when a module, a stub or a runtime dependency is missing from either wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.deploy.artefacts import (
    CLIENT_PACKAGE,
    ROOT,
    SERVER_PACKAGES,
    STUB_SUFFIXES,
    Venv,
    Wheels,
    build_wheels,
    clean_environment,
    copy_tracked_tree,
    make_venv,
    pinned,
    run,
    serve_all,
    tracked_files,
    wait_serving,
)

# Building the wheels and installing them with every extra counts in the first test's
# time; tests/clients alone takes 2-3 minutes: both go past 300 s on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

VERSION = (ROOT / "VERSION").read_text().strip()
#: The client's extras, one per platform adapter module (switchboard_client.platforms.*).
PLATFORM_EXTRAS = ("telegram", "slack")
#: The framework adapters (switchboard_client.frameworks.*) and the extra each needs.
FRAMEWORK_EXTRAS = {
    "switchboard_client.frameworks.langgraph": "langgraph",
    "switchboard_client.frameworks.adk": "adk",
    "switchboard_client.frameworks.openai_agents": "openai-agents",
}
FRAMEWORKS = "switchboard_client.frameworks."
CLIENT_CALLS = Path(__file__).with_name("client_calls.py")


@dataclass
class Installed:
    tree: Path
    wheels: Wheels
    client_venv: Venv
    server_venv: Venv
    install_seconds: float


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("installed")
    tree = copy_tracked_tree(base / "tree")
    wheels = build_wheels(tree, base / "dist")
    started = time.monotonic()
    client_venv = make_venv(base / "client-venv", wheels.client)
    server_venv = make_venv(
        base / "server-venv", wheels.server, wheels.client, *pinned("pytest", "pytest-timeout")
    )
    # The full install takes the platform adapters' extras too, as a bot's deployment
    # would (a second step: pip resolves a wheel file with extras apart from the pin on it).
    run(
        [server_venv.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"{wheels.client}[{','.join([*PLATFORM_EXTRAS, *FRAMEWORK_EXTRAS.values()])}]"],
        cwd=server_venv.root,
    )  # fmt: skip
    print(
        f"\nwheels built in {wheels.build_seconds:.1f} s "
        f"(server {wheels.server.stat().st_size / 1024:.0f} KiB, "
        f"client {wheels.client.stat().st_size / 1024:.0f} KiB); "
        f"both venvs installed in {time.monotonic() - started:.1f} s"
    )
    yield Installed(tree, wheels, client_venv, server_venv, time.monotonic() - started)


def _wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if ".dist-info/" not in name}


def _imports_from(venv: Venv, modules: list[str]) -> dict[str, str]:
    """Imports each module with the venv's python from an empty directory; their files."""
    code = (
        "import importlib, json, sys\n"
        "print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))"
    )
    output = run([venv.python, "-c", code, *modules], cwd=venv.root, env=clean_environment())
    return dict(json.loads(output))


def _module_names(files: set[str]) -> list[str]:
    """Importable module names (not `__main__`: importing it runs the command line)."""
    names = (name.removesuffix(".py").replace("/", ".") for name in files if name.endswith(".py"))
    return sorted(name.removesuffix(".__init__") for name in names if "__main__" not in name)


def test_every_tracked_module_is_in_exactly_one_wheel(installed: Installed) -> None:
    server = _wheel_files(installed.wheels.server)
    client = _wheel_files(installed.wheels.client)
    assert not server & client, f"both wheels ship {sorted(server & client)}"
    python = [name for name in tracked_files() if name.endswith(".py")]
    server_modules = {name for name in python if name.split("/")[0] in SERVER_PACKAGES}
    client_modules = {
        name.removeprefix("clients/python/") for name in python if name.startswith(CLIENT_PACKAGE)
    }
    assert sorted(server_modules - server) == [], "tracked modules missing from the server wheel"
    assert sorted(client_modules - client) == [], "tracked modules missing from the client wheel"
    protos = installed.tree / "protos"
    stubs = {
        f"{proto.relative_to(protos).with_suffix('')}{suffix}"
        for proto in protos.rglob("*.proto")
        for suffix in STUB_SUFFIXES
    }
    assert stubs, "no protos found"
    assert sorted(stubs - client) == [], "generated stubs missing from the client wheel"
    assert "switchboard/__init__.py" not in client, (
        "the client must ship switchboard/ as a namespace portion, not as a package"
    )


def test_client_only_install_imports_the_client_and_nothing_of_the_server(
    installed: Installed,
) -> None:
    venv = installed.client_venv
    everything = _module_names(_wheel_files(installed.wheels.client))
    adapters = [f"switchboard_client.platforms.{extra}" for extra in PLATFORM_EXTRAS]
    modules = [
        name for name in everything if name not in adapters and not name.startswith(FRAMEWORKS)
    ]
    origins = _imports_from(venv, modules)
    site = str(venv.site_packages())
    assert {name: path for name, path in origins.items() if not path.startswith(site)} == {}
    absent = (
        "import importlib.util as u, json\n"
        "names = ['session_service', 'delivery_service', 'switchboard_cli', 'peewee',"
        " 'psycopg2', 'grpc_tools', 'click']\n"
        "print(json.dumps([n for n in names if u.find_spec(n) is not None]))"
    )
    present = json.loads(run([venv.python, "-c", absent], cwd=venv.root, env=clean_environment()))
    assert present == [], f"the client-only venv has server parts: {present}"
    # The platform stand-ins, a shipped testing aid, serve on the client's runtime alone.
    assert "switchboard_client.testing" in origins
    standin = (
        "from switchboard_client.testing import SlackStandIn, TelegramStandIn\n"
        "with TelegramStandIn() as telegram, SlackStandIn() as slack:\n"
        "    print(telegram.base_url.startswith('http://127.0.0.1:'), bool(slack.url))"
    )
    served = run([venv.python, "-c", standin], cwd=venv.root, env=clean_environment())
    assert served.split() == ["True", "True"]
    # Without its extra, an adapter's import says which extra to install.
    needing = [*zip(adapters, PLATFORM_EXTRAS, strict=True), *FRAMEWORK_EXTRAS.items()]
    for module, extra in needing:
        refused = subprocess.run(
            [venv.python, "-c", f"import {module}"],
            cwd=venv.root, env=clean_environment(), capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert refused.returncode != 0
        assert f"pip install 'switchboard-client[{extra}]'" in refused.stderr, refused.stderr
    assert "No broken requirements" in run([venv.python, "-m", "pip", "check"], cwd=venv.root)


def test_full_install_imports_every_module_and_needs_no_code_generator(
    installed: Installed,
) -> None:
    venv = installed.server_venv
    files = _wheel_files(installed.wheels.server) | _wheel_files(installed.wheels.client)
    origins = _imports_from(venv, _module_names(files))
    site = str(venv.site_packages())
    assert {name: path for name, path in origins.items() if not path.startswith(site)} == {}
    generator = "import importlib.util as u; print(u.find_spec('grpc_tools') is None)"
    assert run([venv.python, "-c", generator], cwd=venv.root).strip() == "True", (
        "grpcio-tools must be a build dependency only"
    )
    assert "No broken requirements" in run([venv.python, "-m", "pip", "check"], cwd=venv.root)
    shown = run([venv.bin / "switchboard", "--version"], cwd=venv.root).strip()
    assert shown == f"switchboard, version {VERSION}"


def test_installed_server_serves_from_an_empty_directory_and_stops_on_sigterm(
    installed: Installed, tmp_path: Path
) -> None:
    workdir = tmp_path / "empty"
    workdir.mkdir()
    with serve_all(installed.server_venv.bin / "switchboard", workdir) as server:
        session = server.addresses["SessionService"]
        delivery = server.addresses["DeliveryService"]
        assert wait_serving(session, "switchboard.session.v1.SessionService") == "SERVING"
        assert wait_serving(delivery, "switchboard.delivery.v1.DeliveryService") == "SERVING"
        # The calls go through the client-only venv: the client wheel alone must do.
        output = run(
            [installed.client_venv.python, CLIENT_CALLS, session, delivery, "wheel"],
            cwd=workdir,
            env=clean_environment(),
        )
        result = json.loads(output)
        assert result["session"]["history"] == ["hello wheel"]
        assert result["delivery"]["claimed"] == [result["delivery"]["recorded"]]
        site = str(installed.client_venv.site_packages())
        assert all(path.startswith(site) for path in result["modules"].values() if path != "None")
        # The data directory serve_all names (there is no default one).
        assert {"delivery.sqlite3", "session.sqlite3"} <= set(os.listdir(workdir / "var"))
        code = server.terminate()
    assert code == 0, "".join(server.output)


def test_the_installed_console_serves_its_pages_beside_the_services(
    installed: Installed, tmp_path: Path
) -> None:
    """`serve all --console-listen` from the server wheel: the console's templates and
    static files are in the wheel, and its pages render against the installed services."""
    workdir = tmp_path / "empty"
    workdir.mkdir()
    extra = ("--console-listen", "127.0.0.1:0")
    with serve_all(installed.server_venv.bin / "switchboard", workdir, *extra) as server:
        console = _console_url(server.output)
        with httpx.Client(base_url=console, follow_redirects=False, timeout=10) as browser:
            # Authentication is off on both services: the console's login takes no token.
            login = browser.post("/login", data={"token": ""}, headers={"origin": console})
            assert login.status_code == 303, login.text
            for page in ("/", "/sessions", "/deliveries", "/audit", "/static/console.css"):
                answer = browser.get(page)
                assert answer.status_code == 200, f"{page}: {answer.status_code} {answer.text}"
        assert server.terminate() == 0, "".join(server.output)


def _console_url(output: list[str], timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(output):
            if "console on http://" in line:
                return line.split("console on ", 1)[1].strip()
        time.sleep(0.1)
    raise AssertionError("the console did not start:\n" + "".join(output))


def test_client_side_suite_passes_against_the_installed_wheels(
    installed: Installed, tmp_path: Path
) -> None:
    """tests/clients with the server venv's python, from a directory holding only the
    tests (and the pytest configuration): every import must resolve to the wheels."""
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copytree(installed.tree / "tests", suite / "tests")
    readme = suite / "clients" / "python" / "README.md"  # its blocks are run by the suite
    readme.parent.mkdir(parents=True)
    readme.write_bytes((installed.tree / "clients" / "python" / "README.md").read_bytes())
    (suite / "pyproject.toml").write_bytes((installed.tree / "pyproject.toml").read_bytes())
    # The published key vectors the clients' key builders are checked against (data).
    shutil.copytree(installed.tree / "protos" / "testdata", suite / "protos" / "testdata")
    # The Node client's reply sealer, which the sealed-target test runs with node (not Python).
    shutil.copytree(installed.tree / "clients" / "node" / "src", suite / "clients" / "node" / "src")
    origins_file = tmp_path / "origins.json"
    result = subprocess.run(
        [str(installed.server_venv.python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "tests.deploy.import_origins", "tests/clients"],
        cwd=suite,
        env={**clean_environment(), "SWITCHBOARD_IMPORT_ORIGINS": str(origins_file)},
        capture_output=True,
        text=True,
        timeout=560,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    origins = json.loads(origins_file.read_text())
    site = str(installed.server_venv.site_packages())
    outside = {name: path for name, path in origins.items() if path and not path.startswith(site)}
    assert outside == {}, "modules imported from outside the installed wheels"
    for module in (
        "switchboard_client.gateway",
        "switchboard.session.v1.session_service_pb2",
        "session_service.app",
        "delivery_service.app",
    ):
        assert module in origins, f"{module} was never imported: the proof proves nothing"
