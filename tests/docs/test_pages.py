"""Every code block of the docs runs, as written, against real services.

The pages are README.md, every page of the site (docs/) and the client READMEs;
`tests/docs/walk.py` says how a page is walked and what its directives mean. Each
page is walked twice in one directory (every example must run twice: it creates
what it needs idempotently), against one SessionService and one DeliveryService
on SQLite shared by the whole module, unless a page starts its own (`serves`).
README.md is walked by tests/docs/test_readme.py, which checks its tour's promises.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.blocks import read_blocks
from tests.docs.walk import (
    NODE,
    PAGES,
    README,
    ROOT,
    blocks_of,
    ensure_node_modules,
    problems,
    relative,
    run,
    runs,
    walk_twice,
)
from tests.harness import EventLoopThread, delivery_server, session_server


@dataclass
class Services:
    session: str
    delivery: str


@pytest.fixture(scope="module")
def services(
    loop_thread: EventLoopThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Services]:
    """One pair of services for every page of the module (a page's examples create
    what they need, so they share them as readers share a deployment)."""
    directory = tmp_path_factory.mktemp("docs-services")
    with (
        session_server(loop_thread, f"sqlite:///{directory / 'session.sqlite3'}") as session,
        delivery_server(loop_thread, f"sqlite:///{directory / 'delivery.sqlite3'}") as delivery,
    ):
        yield Services(session.address, delivery.address)


# -- the blocks themselves ------------------------------------------------------------------


def test_every_page_has_blocks_that_are_labelled_with_known_directives() -> None:
    assert {page.name for page in PAGES} >= {"README.md", "index.md", "concepts.md"}
    found = [problem for page in PAGES for block in blocks_of(page) for problem in problems(block)]
    assert not found, "\n".join(found)


def test_the_block_reader_reads_fences_and_directives(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- docs: no-run needs a cluster -->\n<!-- docs: in-checkout -->\n"
        "```sh extra words\nkubectl apply\n```\n\n  ~~~python\n  print(1)\n\n  ~~~\n```\n```\n"
    )
    first, second, third = read_blocks(page)
    assert (first.line, first.language, first.code) == (5, "sh", "kubectl apply\n")
    assert first.directives == {"no-run": "needs a cluster", "in-checkout": ""}
    assert (second.language, second.code, second.directives) == ("python", "print(1)\n\n", {})
    assert (third.language, third.code) == ("", "")
    page.write_text("```sh\nnever closed\n")
    with pytest.raises(ValueError, match="unclosed"):
        read_blocks(page)


def test_the_python_blocks_pass_the_repositorys_lint_and_strict_types(tmp_path: Path) -> None:
    """What users copy is held to the code's own standard (ruff, mypy --strict).

    Import order is left out: in this checkout `switchboard` is first-party, in a
    user's project it is not, so the two would sort the imports differently."""
    scripts = []
    for page in PAGES:
        for block in blocks_of(page):
            if block.language == "python":
                name = f"{relative(page).replace('/', '_').replace('.', '_')}_{block.line}.py"
                (tmp_path / name).write_text(block.code)
                scripts.append(str(tmp_path / name))
    assert len(scripts) > 10, "the docs have hardly any python blocks"
    bin_dir = Path(sys.executable).parent
    config = str(ROOT / "pyproject.toml")
    for command in (
        [str(bin_dir / "ruff"), "check", "--config", config, "--extend-ignore", "I", *scripts],
        [str(bin_dir / "ruff"), "format", "--config", config, "--check", *scripts],
        [str(bin_dir / "mypy"), "--cache-dir", str(tmp_path / "mypy-cache"), *scripts],
    ):
        done = run(command, ROOT, dict(os.environ))
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.output}"


# -- running them ---------------------------------------------------------------------------

WALKED = [page for page in PAGES if page != README and any(runs(b) for b in blocks_of(page))]


@pytest.mark.parametrize("page", WALKED, ids=relative)
def test_every_block_of_the_page_runs_twice_against_real_services(
    page: Path, services: Services, tmp_path: Path
) -> None:
    if any(block.language == "js" and runs(block) for block in blocks_of(page)):
        if NODE is None:
            pytest.skip("node is not on PATH: the page's js blocks run with Node.js 20+")
        ensure_node_modules()
    checkout_data = _mtime(ROOT / "var")

    walk_twice(page, tmp_path, services.session, services.delivery)

    assert _mtime(ROOT / "var") == checkout_data, "a block wrote into the checkout's var/"


def _mtime(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.exists() else None
