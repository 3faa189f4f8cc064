"""README.md is a short tutorial, not a notebook, and its tour keeps its promises.

The walk (`tests/docs/walk.py`) runs every block twice in order: the services come
from the README's own `python3 dev.py serve` block (`serves`), so the tour runs
against what a reader starts. One inbound message gets one reply however often the
tour runs, and the rewind takes the answer out of the history. A fresh clone's
`dev.py serve` installs no dev tool, and the README runs as written on that too.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

from tests.deploy.artefacts import copy_tracked_tree
from tests.docs.walk import README, ROOT, block_env, walk_twice

#: What the tour's stand-in for the platform prints for each send.
SENT = "telegram <- "
#: The README is the front door: what does not fit here belongs in docs/.
MOST_LINES = 220
_LINK = re.compile(r"\]\((?!https?://|#)([^)#\s]+)(?:#([^)\s]+))?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def test_the_readme_is_short_and_dated_by_nothing() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MOST_LINES, "move detail into docs/"
    assert not re.search(r"\bissue \d+|\(#\d+\)", text, re.IGNORECASE), "no issue numbers"
    assert not re.search(r"\b\d[\d,.]* ?(?:ms|µs|MB|GB|/s)\b", text), "figures go to docs/"


def test_the_readmes_links_reach_files_and_headings_that_exist() -> None:
    links = _LINK.findall(README.read_text())
    assert any(target.startswith("docs/") for target, _ in links), "the README links into docs/"
    for target, anchor in links:
        path = ROOT / target
        assert path.exists(), f"README links to {target}, which does not exist"
        if anchor:
            headings = _HEADING.findall(path.read_text())
            slugs = {slugify(heading, "-") for heading in headings}
            assert anchor in slugs, f"README links to {target}#{anchor}: no such heading"


def test_every_readme_block_runs_twice_and_the_tour_answers_once(tmp_path: Path) -> None:
    checkout_data = _mtime(ROOT / "var")

    walked = walk_twice(README, tmp_path, "127.0.0.1:1", "127.0.0.1:1")

    sends = [line for out in walked.printed() for line in out.splitlines() if SENT in line]
    assert len(sends) == 1, f"one inbound message, one send over every run: {sends}"
    (rewound,) = [out for block, out in walked.first if "sessions.rewind(" in block.code]
    before, after = _history_lines(rewound.output)
    assert len(before) == 2 and after == before[:1], rewound.output
    assert _mtime(ROOT / "var") == checkout_data, "a block wrote into the checkout's var/"


#: What only `dev.py test` installs (the dev extra), as distribution names.
DEV_TOOLS = ("pytest", "mypy", "ruff", "grpcio-tools", "buf-bin", "matplotlib", "mkdocs")


@pytest.mark.slow
def test_the_readme_runs_as_written_on_a_fresh_clones_runtime_only_serve(tmp_path: Path) -> None:
    clone = copy_tracked_tree(tmp_path / "clone")
    python = clone / ".venv" / "bin" / "python"
    # The first serve installs (minutes on a busy machine, past a block's timeout); the
    # README's own serve block then starts on that venv without installing again.
    first = _dev_serve(clone, "--help", directory=tmp_path)
    assert "dev.py: installing" in first and "Usage:" in first, first
    installed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True,
    ).stdout.lower()  # fmt: skip
    present = [tool for tool in DEV_TOOLS if f"\n{tool}==" in f"\n{installed}"]
    assert present == [], f"serve installed dev tools: {present}"

    walked = walk_twice(
        clone / "README.md", tmp_path / "walk", "127.0.0.1:1", "127.0.0.1:1",
        checkout=clone, python=python,
    )  # fmt: skip

    reinstalls = [out for out in walked.printed() if "dev.py: installing" in out]
    assert reinstalls == [], "a second serve on the same inputs installed again"
    sends = [line for out in walked.printed() for line in out.splitlines() if SENT in line]
    assert len(sends) == 1, sends


def _dev_serve(clone: Path, *arguments: str, directory: Path) -> str:
    done = subprocess.run(
        [sys.executable, clone / "dev.py", "serve", *arguments],
        env=block_env(directory, "127.0.0.1:1", "127.0.0.1:1"),
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _history_lines(printed: str) -> tuple[list[str], list[str]]:
    shown = {line.split(":", 1)[0].strip(): line.split(":", 1)[1] for line in printed.splitlines()}
    return ast.literal_eval(shown["before"]), ast.literal_eval(shown["after"])


def _mtime(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.exists() else None
