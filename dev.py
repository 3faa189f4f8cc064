#!/usr/bin/env python3
"""The two quick-start commands, needing nothing but Python 3.11+:

    python3 dev.py serve    # both services on SQLite under ./var, addresses printed
    python3 dev.py test     # the whole test suite (lint, types, contracts, both backends)

Each creates ./.venv on first use and installs both distributions there, editable:
switchboard-client (clients/python, whose install generates the gRPC stubs into
switchboard/) and switchboard with its dev tools; it reinstalls them whenever a
pyproject.toml, VERSION or a .proto file changes.
Arguments after the command are passed on (`python3 dev.py test -k claim`);
`serve` passes them to `switchboard serve`, which takes every option of the
`switchboard` group too (`python3 dev.py serve --log-format text --access-log
errors`, `python3 dev.py serve session --auth-tokens ...`; `--help` lists them).
"""

from __future__ import annotations

import hashlib
import os
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


def ensure_environment() -> Path:
    if sys.version_info < (3, 11):  # noqa: UP036 - say so clearly on an old Python
        sys.exit(f"Switchboard needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    python = BIN / "python"
    if not python.exists():
        print("dev.py: creating .venv", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    wanted = _inputs_digest()
    if not STAMP.exists() or STAMP.read_text() != wanted:
        print("dev.py: installing switchboard-client, switchboard and its dev tools", flush=True)
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
                f"{ROOT}[dev]",
            ],
            check=True,
        )
        STAMP.write_text(wanted)
    return python


SERVED = ("all", "session", "delivery")


def _command(name: str, rest: list[str]) -> list[str]:
    """The module and arguments `python` runs for `dev.py NAME REST...`."""
    if name == "test":
        return ["-m", "pytest", *rest]
    # `serve` serves both services unless told which.
    which = [] if rest and rest[0] in SERVED else ["all"]
    return ["-m", "switchboard", "serve", *which, *rest]


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("serve", "test"):
        sys.exit(__doc__)
    python = ensure_environment()
    os.chdir(ROOT)
    argv = [str(python), *_command(sys.argv[1], sys.argv[2:])]
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
