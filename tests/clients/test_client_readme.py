"""clients/python/README.md runs: every ```python block, in order, against real
services (each block in a fresh interpreter, as a user would paste it). Every
other block must say what it is (```sh, ```text), so none is skipped unmarked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.docs.blocks import read_blocks
from tests.harness import EventLoopThread, delivery_server, session_server

README = Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"
NOT_RUN = {"sh", "text"}


def blocks(path: Path) -> list[tuple[str, str, str]]:
    """(language, where it is, code) for every fenced block."""
    return [(block.language, block.where, block.code) for block in read_blocks(path)]


def test_every_block_is_marked() -> None:
    languages = [language for language, _, _ in blocks(README)]
    assert "python" in languages
    assert set(languages) <= NOT_RUN | {"python"}, f"unmarked blocks: {languages}"


def test_the_python_blocks_run_against_real_services(
    loop_thread: EventLoopThread, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'readme.sqlite3'}"
    examples = [(h, code) for language, h, code in blocks(README) if language == "python"]
    with session_server(loop_thread, url) as session, delivery_server(loop_thread, url) as delivery:
        env = {
            **os.environ,
            "SWITCHBOARD_SESSION_ADDRESS": session.address,
            "SWITCHBOARD_DELIVERY_ADDRESS": delivery.address,
        }
        for number, (heading, code) in enumerate(examples, start=1):
            script = tmp_path / f"example_{number}.py"
            script.write_text(code)
            ran = subprocess.run(
                [sys.executable, str(script)],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert ran.returncode == 0, f"example {number} ({heading}) failed:\n{ran.stderr}"
