"""What a user installs, built the way a user builds it: both wheels from the tracked
files only, installed into fresh venvs outside the checkout, and `switchboard serve
all` run from an empty directory.

Nothing here imports the checkout's packages into an installed venv: commands run
with the venv's own interpreter, from directories that hold no source.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
SERVER_PACKAGES = (
    "switchboard",
    "session_service",
    "delivery_service",
    "switchboard_console",
    "switchboard_cli",
)
CLIENT_PACKAGE = "clients/python/switchboard_client"
STUB_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi")
_LISTENING = re.compile(r"(\w+Service) listening on (\S+)")


def run(command: Sequence[str | Path], timeout: float = 600, **kwargs: object) -> str:
    """Runs a command and returns its output; fails with all of it otherwise."""
    result = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )
    if result.returncode != 0:
        raise AssertionError(
            f"`{' '.join(map(str, command))}` exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
        )
    return str(result.stdout)


def tracked_files() -> list[str]:
    """The files git tracks (staged included), as a fresh clone would have them."""
    listing = run(["git", "ls-files", "-z", "--cached"], cwd=ROOT)
    return [name for name in listing.split("\0") if name and (ROOT / name).is_file()]


def copy_tracked_tree(destination: Path) -> Path:
    """The working tree's tracked files (with uncommitted edits) and nothing else:
    an untracked module or a generated stub cannot hide a hole in the wheels."""
    for name in tracked_files():
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return destination


def pinned(*names: str) -> list[str]:
    """The dev extra's exact pins of the named tools (pytest for the installed suite)."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {re.split(r"[=<>\[]", pin, maxsplit=1)[0]: pin for pin in dev["dev"]}
    return [pins[name] for name in names]


@dataclass
class Wheels:
    server: Path
    client: Path
    build_seconds: float


def build_wheels(tree: Path, dist: Path) -> Wheels:
    """`pip wheel` of both distributions from `tree`, as the Dockerfile does."""
    started = time.monotonic()
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", dist,
         tree / "clients" / "python", tree],
        cwd=tree,
    )  # fmt: skip
    (client,) = dist.glob("switchboard_client-*.whl")
    (server,) = dist.glob("switchboard-*.whl")
    return Wheels(server, client, time.monotonic() - started)


@dataclass
class Venv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def site_packages(self) -> Path:
        code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        return Path(run([self.python, "-c", code], cwd=self.root).strip())


def make_venv(path: Path, *requirements: str | Path) -> Venv:
    """A fresh venv (from the base interpreter) with `requirements` installed by pip,
    through pip's cache like any user's install."""
    run([sys.executable, "-m", "venv", path])
    venv = Venv(path)
    run(
        [venv.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         *requirements],
        cwd=path,
    )  # fmt: skip
    return venv


def clean_environment() -> dict[str, str]:
    """os.environ without anything that would point an interpreter at the checkout."""
    return {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }


@dataclass
class ServeAll:
    """`switchboard serve all` from an installed venv, in its own empty directory."""

    process: subprocess.Popen[str]
    addresses: dict[str, str]
    output: list[str] = field(default_factory=list)

    def terminate(self, timeout_s: float = 30.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)


@contextmanager
def serve_all(switchboard: Path, workdir: Path, *extra: str) -> Iterator[ServeAll]:
    command = [
        str(switchboard), "serve", "all", "--data-dir", str(workdir / "var"),
        "--session-listen", "127.0.0.1:0", "--delivery-listen", "127.0.0.1:0",
        "--drain-grace", "5", *extra,
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=workdir,
        env=clean_environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = ServeAll(process, {})
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        for line in process.stdout:
            server.output.append(line)
            match = _LISTENING.search(line)
            if match:
                server.addresses[match.group(1)] = match.group(2)
            if ("ready;" in line and server.addresses) or time.monotonic() > deadline:
                break
        if len(server.addresses) != 2:
            process.kill()
            raise AssertionError("serve all did not start:\n" + "".join(server.output))
        keep_reading = threading.Thread(
            target=lambda: server.output.extend(process.stdout or ()), daemon=True
        )
        keep_reading.start()
        yield server
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def health_status(address: str, service: str, timeout_s: float = 5.0) -> str:
    """The grpc.health.v1 status name `address` answers for `service` ("" is the server)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def wait_serving(address: str, service: str, timeout_s: float = 60.0) -> str:
    """Polls health until SERVING; returns the last status (or error) seen."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            last = health_status(address, service, timeout_s=2.0)
            if last == "SERVING":
                return last
        except grpc.RpcError as exc:
            last = f"{exc.code().name}: {exc.details()}"
        time.sleep(0.3)
    return last
