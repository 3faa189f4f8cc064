"""deploy/compose.yaml brought up and down on the test's own engine.

Compose v2 (`docker compose`) when the engine's CLI has the plugin, else Debian's
Compose v1 (`docker-compose`, 1.29; CI installs the package when missing).
SWITCHBOARD_COMPOSE names one explicitly ("docker compose" or "docker-compose"),
so that both can be run against the same file.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.docker_engine import Engine

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "deploy" / "compose.yaml"


def compose_command(engine: Engine) -> list[str] | None:
    """The compose command to run, or None when there is none here."""
    chosen = os.environ.get("SWITCHBOARD_COMPOSE", "").strip()
    if chosen:
        words = shlex.split(chosen)
        return [engine.cli, *words[1:]] if words[0] == "docker" else words
    if engine.run("compose", "version", check=False).returncode == 0:
        return [engine.cli, "compose"]
    v1 = shutil.which("docker-compose")
    return [v1] if v1 else None


def install_compose() -> None:
    """Debian's docker-compose, with apt-get (update first if needed)."""
    command = ["apt-get", "install", "-y", "-q", "docker-compose"]
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(command, env=environment, capture_output=True, check=False).returncode:
        subprocess.run(
            ["apt-get", "update", "-q"], env=environment, capture_output=True, check=True
        )
        subprocess.run(command, env=environment, capture_output=True, check=True)


@dataclass
class Project:
    """One `compose -p NAME -f FILE` project on the engine."""

    engine: Engine
    command: list[str]
    file: Path
    name: str
    settings: dict[str, str]

    def run(
        self, *args: str, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        environment = {
            **os.environ,
            **self.settings,
            "DOCKER_HOST": f"unix://{self.engine.socket}",
        }
        argv = [*self.command, "--project-name", self.name, "--file", str(self.file), *args]
        result = subprocess.run(
            argv, env=environment, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{shlex.join(argv)} exited {result.returncode}\n"
                f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}\n{self.logs()}"
            )
        return result

    def container(self, service: str) -> str:
        ids = self.run("ps", "--quiet", service).stdout.split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return ids[0]

    def health(self, service: str) -> str:
        return self.engine.out(
            "inspect", "--format", "{{.State.Status}} {{.State.Health.Status}}",
            self.container(service),
        )  # fmt: skip

    def wait_healthy(self, services: Sequence[str], timeout_s: float) -> None:
        """Each service's container running and its health check passing."""
        deadline = time.monotonic() + timeout_s
        for service in services:
            state = self.health(service)
            while state != "running healthy" and time.monotonic() < deadline:
                assert state.startswith("running"), f"{service} is {state}:\n{self.logs()}"
                time.sleep(1)
                state = self.health(service)
            assert state == "running healthy", f"{service} is {state}:\n{self.logs()}"

    def logs(self) -> str:
        done = self.run("logs", "--no-color", "--tail", "40", check=False, timeout=60)
        return done.stdout[-8000:] + done.stderr[-2000:]

    def containers_left(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.name}"
        return self.engine.out("ps", "--all", "--quiet", "--filter", label).split()


@contextmanager
def brought_up(
    engine: Engine, command: list[str], settings: dict[str, str], file: Path = COMPOSE_FILE
) -> Iterator[Project]:
    """`up --detach` with the images already there; `down --volumes` afterwards."""
    project = Project(engine, command, file, f"sb{uuid.uuid4().hex[:8]}", settings)
    try:
        project.run("up", "--detach", "--no-build", timeout=600)
        yield project
    finally:
        project.run("down", "--volumes", "--timeout", "30", timeout=300, check=False)
