"""The OpenAI Agents SDK's own session tests (`tests/memory` of its sdist, downloaded
from PyPI) run against `SwitchboardSession` on a real server, SQLite and Postgres:
`sdk_substitute` (a pytest plugin of ours) makes every `SQLiteSession` they build a
Switchboard conversation. Every deselection is listed with its reason in
`sdk_substitute.DESELECTED`; none may fail, none may be skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.frameworks.openai_agents import sdk_substitute
from tests.frameworks.openai_agents.conftest import AGENT
from tests.harness import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

#: At least this many of the SDK's tests build the session under test (79 at 0.24.0).
OURS_AT_LEAST = 75


def test_the_sdks_session_tests_pass_on_switchboard(
    server: ServerProcess, sdk_sdist: Path, tmp_path: Path
) -> None:
    from switchboard_client.session import SessionClient

    with SessionClient(server.address) as client:
        client.create_agent(AGENT)
    junit, report = tmp_path / "junit.xml", tmp_path / "report.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(sdk_substitute.__file__).parent),
        "SWITCHBOARD_SESSION_TARGET": server.address,
        "SWITCHBOARD_AGENT": AGENT,
        "SWITCHBOARD_SDK_REPORT": str(report),
    }
    env.pop("PYTEST_ADDOPTS", None)
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-p", "sdk_substitute", "-p", "no:cacheprovider",
            "-c", str(sdk_sdist / "pyproject.toml"), "--rootdir", str(sdk_sdist),
            "-q", "-rfEs", f"--junitxml={junit}", "tests/memory",
        ],
        cwd=sdk_sdist, env=env, capture_output=True, text=True, timeout=1100,
    )  # fmt: skip
    said = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, said
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None, said
    counts = {key: int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, (counts, said)
    ours = json.loads(report.read_text())["used_our_session"]
    assert len(ours) >= OURS_AT_LEAST, (len(ours), said)
    print(f"SDK tests/memory on Switchboard: {counts}, {len(ours)} built our session")
