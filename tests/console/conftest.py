"""Fixtures of the console's tests: one seeded deployment and one browser per module,
on each backend.

The browser is Debian's chromium driven by Playwright (Playwright's own browser
download is not reachable here). Without chromium the browser tests skip, except
in CI or with SWITCHBOARD_REQUIRE_BROWSER=1, where they fail.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.deployment import TOKENS, Deployment, deployed
from tests.harness import EventLoopThread, postgres_schema, postgres_unreachable_reason

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
_REQUIRE_BROWSER = os.environ.get("SWITCHBOARD_REQUIRE_BROWSER", "") in ("1", "true") or (
    os.environ.get("CI", "").lower() in ("1", "true")
)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """Both services and the console on a fresh, seeded database, shared by a module."""
    loop = EventLoopThread()
    try:
        if request.param == "sqlite":
            path = tmp_path_factory.mktemp("console") / "switchboard.sqlite3"
            with deployed(loop, f"sqlite:///{path}") as ready:
                yield ready
            return
        reason = postgres_unreachable_reason()
        if reason:
            pytest.skip(reason)
        with postgres_schema() as url, deployed(loop, url) as ready:
            yield ready
    finally:
        loop.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = shutil.which("chromium")
    if executable is None:
        message = "chromium is not installed (apt-get install chromium)"
        if _REQUIRE_BROWSER:
            pytest.fail(f"{message}; SWITCHBOARD_REQUIRE_BROWSER requires the browser tests")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def log_in(browser: Any, deployment: Deployment, who: str = "admin", url: str = "") -> Any:
    """A new browser context logged in with `who`'s token through the login form."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{url or deployment.url}/login")
    page.fill("#token", TOKENS[who])
    page.click("button[type=submit]")
    page.wait_for_load_state()
    return page
