"""README.md is a short tutorial, not a notebook, and its tour keeps its promises.

The walk (`tests/docs/walk.py`) runs every block twice in order: the services come
from the README's own `python3 dev.py serve` block (`serves`), so the tour runs
against what a reader starts. One inbound message gets one reply however often the
tour runs, and the rewind takes the answer out of the history.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from markdown.extensions.toc import slugify

from tests.docs.walk import README, ROOT, walk_twice

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


def _history_lines(printed: str) -> tuple[list[str], list[str]]:
    shown = {line.split(":", 1)[0].strip(): line.split(":", 1)[1] for line in printed.splitlines()}
    return ast.literal_eval(shown["before"]), ast.literal_eval(shown["after"])


def _mtime(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.exists() else None
