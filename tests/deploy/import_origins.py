"""A pytest plugin for the suite run against installed wheels: at the end it writes
where every Switchboard module came from to $SWITCHBOARD_IMPORT_ORIGINS (JSON), so
the caller can prove nothing was imported from a checkout."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

PACKAGES = (
    "switchboard",
    "switchboard_client",
    "session_service",
    "delivery_service",
    "switchboard_cli",
)


def pytest_sessionfinish(session: pytest.Session) -> None:
    origins = {
        name: getattr(module, "__file__", None)
        for name, module in sorted(sys.modules.items())
        if name.split(".")[0] in PACKAGES
    }
    Path(os.environ["SWITCHBOARD_IMPORT_ORIGINS"]).write_text(json.dumps(origins))
