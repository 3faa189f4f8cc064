#!/usr/bin/env python3
"""The two quick-start commands, needing nothing but Python 3.11+:

    python3 dev.py serve    # both services on SQLite under ./var, addresses printed
    python3 dev.py test     # the whole test suite (lint, types, contracts, both backends)

Each creates ./.venv on first use and reinstalls the project there whenever
pyproject.toml or a .proto file changes (the gRPC stubs are generated at install).
Arguments after the command are passed on (`python3 dev.py test -k claim`).
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


def _inputs_digest() -> str:
    digest = hashlib.sha256()
    for path in [ROOT / "pyproject.toml", *sorted((ROOT / "protos").rglob("*.proto"))]:
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
        print("dev.py: installing switchboard and its dev tools into .venv", flush=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-e",
                f"{ROOT}[dev]",
            ],
            check=True,
        )
        STAMP.write_text(wanted)
    return python


def main() -> None:
    commands = {"serve": ["-m", "switchboard", "serve", "all"], "test": ["-m", "pytest"]}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    python = ensure_environment()
    os.chdir(ROOT)
    argv = [str(python), *commands[sys.argv[1]], *sys.argv[2:]]
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
