#!/usr/bin/env python3
"""The two quick-start commands, needing nothing but Python 3.11+:

    python3 dev.py serve    # both services on SQLite under ./var, addresses printed
    python3 dev.py test     # the whole test suite (lint, types, contracts, both backends)

Each creates ./.venv on first use and installs both distributions there, editable:
switchboard-client (clients/python, whose install generates the gRPC stubs into
switchboard/) and switchboard. `serve` installs only what they need to run (their
build tools, grpcio-tools among them, stay in pip's isolated build environments);
`test` adds the dev extra (pytest, mypy, ruff, buf, the platform SDKs, ...) on top.
Either reinstalls whenever a pyproject.toml, VERSION, the client's build hook or a
.proto file changes, and never drops the dev extra once it is there.
Arguments after the command are passed on (`python3 dev.py test -k claim`); `test`
alone runs the whole suite on 2 to 4 workers (pytest-xdist, a module per worker);
`serve` passes them to `switchboard serve`, which takes every option of the
`switchboard` group too (`python3 dev.py serve --log-format text --access-log
errors`, `python3 dev.py serve session --auth-tokens ...`; `--help` lists them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".switchboard-installed"
CLIENT = ROOT / "clients" / "python"
CLIENT_INPUTS = [CLIENT / "pyproject.toml", CLIENT / "hatch_build.py"]


def _inputs_digest() -> str:
    digest = hashlib.sha256()
    inputs = [ROOT / "pyproject.toml", ROOT / "VERSION", *CLIENT_INPUTS]
    for path in [*inputs, *sorted((ROOT / "protos").rglob("*.proto"))]:
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


#: The extras of switchboard each command needs installed.
EXTRAS: dict[str, frozenset[str]] = {"serve": frozenset(), "test": frozenset({"dev"})}


def _installed(stamp: str) -> tuple[str, frozenset[str]] | None:
    """The inputs digest and extras the stamp records; None when it is unreadable.
    A bare digest is an older dev.py's stamp, which always installed the dev extra."""
    if re.fullmatch(r"[0-9a-f]{64}", stamp):
        return stamp, frozenset({"dev"})
    try:
        recorded = json.loads(stamp)
        return str(recorded["inputs"]), frozenset(recorded["extras"])
    except (ValueError, TypeError, KeyError):
        return None


def extras_to_install(
    stamp: str | None, inputs: str, needed: frozenset[str]
) -> frozenset[str] | None:
    """The extras to (re)install for a command that needs `needed`, or None when the
    venv already has them for these inputs. A reinstall keeps the extras already
    there: `serve` after `test` must not leave a venv that `test` installs again."""
    installed = _installed(stamp) if stamp is not None else None
    if installed is None:
        return needed
    digest, extras = installed
    if digest == inputs and needed <= extras:
        return None
    return needed | extras


def _stamp(inputs: str, extras: frozenset[str]) -> str:
    return json.dumps({"inputs": inputs, "extras": sorted(extras)})


def ensure_environment(needed: frozenset[str]) -> Path:
    if sys.version_info < (3, 11):  # noqa: UP036 - say so clearly on an old Python
        sys.exit(f"Switchboard needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    python = BIN / "python"
    if not python.exists():
        print("dev.py: creating .venv", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    inputs = _inputs_digest()
    extras = extras_to_install(STAMP.read_text() if STAMP.exists() else None, inputs, needed)
    if extras is not None:
        tools = " and its dev tools" if "dev" in extras else " (what they need to run)"
        print(f"dev.py: installing switchboard-client, switchboard{tools}", flush=True)
        server = f"{ROOT}[{','.join(sorted(extras))}]" if extras else str(ROOT)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-e",
                str(CLIENT),
                "-e",
                server,
            ],
            check=True,
        )
        STAMP.write_text(_stamp(inputs, extras))
    return python


SERVED = ("all", "session", "delivery")


#: Test workers for the whole suite: most of its time is spent waiting on servers,
#: databases and subprocesses, so two workers pay even on two cores; more than four
#: would crowd one PostgreSQL's connections.
MAX_TEST_WORKERS = 4


def _command(name: str, rest: list[str]) -> list[str]:
    """The module and arguments `python` runs for `dev.py NAME REST...`."""
    if name == "test":
        if rest:  # a chosen part of the suite runs as asked
            return ["-m", "pytest", *rest]
        # The whole suite, a module per worker at a time (module fixtures stay shared).
        workers = max(2, min(os.cpu_count() or 2, MAX_TEST_WORKERS))
        return ["-m", "pytest", "-n", str(workers), "--dist", "loadscope", "--durations=25"]
    # `serve` serves both services unless told which.
    which = [] if rest and rest[0] in SERVED else ["all"]
    return ["-m", "switchboard_cli", "serve", *which, *rest]


def environment(name: str, inherited: dict[str, str]) -> dict[str, str]:
    """`serve` keeps its SQLite files in the checkout's var/, named explicitly (the
    command never falls back on the current directory), unless the caller's
    SWITCHBOARD_DATA_DIR names another place; a --data-dir argument wins over both."""
    if name == "serve":
        return {"SWITCHBOARD_DATA_DIR": str(ROOT / "var"), **inherited}
    return dict(inherited)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("serve", "test"):
        sys.exit(__doc__)
    python = ensure_environment(EXTRAS[sys.argv[1]])
    os.chdir(ROOT)
    argv = [str(python), *_command(sys.argv[1], sys.argv[2:])]
    os.execve(argv[0], argv, environment(sys.argv[1], dict(os.environ)))


if __name__ == "__main__":
    main()
