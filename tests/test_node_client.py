"""The Node.js client (clients/node) passes its own tests against the real services.

`npm ci` installs exactly what clients/node/package-lock.json pins, then
`npm test` (node --test) spawns `python -m switchboard_cli serve all` with this
interpreter and drives both services through the client.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODE_CLIENT = ROOT / "clients" / "node"
_NODE = shutil.which("node")
_NPM = shutil.which("npm")
_MISSING = [name for name, path in (("node", _NODE), ("npm", _NPM)) if path is None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(_MISSING),
        reason=f"{' and '.join(_MISSING)} not on PATH: the Node client's tests need Node.js 20+",
    ),
]


def _npm(npm: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "SWITCHBOARD_PYTHON": sys.executable,
        "npm_config_update_notifier": "false",
    }
    return subprocess.run(
        [npm, *args],
        cwd=NODE_CLIENT,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _report(result: subprocess.CompletedProcess[str]) -> str:
    command = " ".join(str(part) for part in result.args)
    return (
        f"`{command}` in {NODE_CLIENT} exited {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )


def test_node_client_passes_its_tests_against_the_real_services() -> None:
    assert _NPM is not None  # the skip above guarantees it
    installed = _npm(_NPM, "ci", "--no-audit", "--no-fund", "--prefer-offline", timeout=180)
    assert installed.returncode == 0, _report(installed)
    tested = _npm(_NPM, "test", timeout=120)
    assert tested.returncode == 0, _report(tested)
