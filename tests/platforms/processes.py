"""Gateway processes running a real adapter (tests/platforms/gateway_process.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.platforms.conftest import Services

ROOT = Path(__file__).resolve().parents[2]


class GatewayProcess:
    """`python -m tests.platforms.gateway_process`, booted (it printed "ready")."""

    def __init__(self, platform: str, services: Services, base_url: str, *flags: str) -> None:
        command = [
            sys.executable,
            "-m",
            "tests.platforms.gateway_process",
            platform,
            services.session_address,
            services.delivery_address,
            base_url,
            *flags,
        ]
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.events_url = ""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("events: "):
                self.events_url = line.split(" ", 1)[1].strip()
            if line.strip() == "ready":
                return
        self.process.wait(timeout=30)
        raise AssertionError(f"the gateway process did not boot:\n{self._stderr()}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_killed(self) -> None:
        """The test's SIGKILL arrived (the stand-in sent it mid-send)."""
        code = self.process.wait(timeout=60)
        assert code == -signal.SIGKILL, f"exit {code}:\n{self._stderr()}"

    def terminate(self) -> None:
        """A graceful stop (SIGTERM): it deregisters and exits 0."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        assert code == 0, f"exit {code}:\n{self._stderr()}"

    def kill_quietly(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def _stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read() if self.process.poll() is not None else ""
