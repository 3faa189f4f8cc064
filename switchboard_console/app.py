"""The console's web application: routes, error pages, and its start and stop."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from switchboard_client.errors import SwitchboardError

from switchboard_console import actions, pages
from switchboard_console.clients import Channels
from switchboard_console.live import LiveHub
from switchboard_console.security import SecurityHeaders
from switchboard_console.web import (
    Console,
    ConsoleSettings,
    NeedsLogin,
    PageError,
    page_error_of,
    render,
)

log = logging.getLogger(__name__)


async def _page_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PageError)
    return render(request, "error.html", exc.status, title=exc.title, message=exc.message)


async def _service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SwitchboardError)
    return await _page_error(request, page_error_of(exc))


async def _needs_login(request: Request, exc: Exception) -> Response:
    if request.method != "GET":
        return await _page_error(request, PageError(401, "Log in", "log in, then try again"))
    return RedirectResponse("/login", status_code=303)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    title = "Not found" if exc.status_code == 404 else "Refused"
    return await _page_error(request, PageError(exc.status_code, title, str(exc.detail)))


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Logged with its trace for the operator of the console; the page shows none.
    log.exception("console: %s %s failed", request.method, request.url.path)
    return await _page_error(
        request,
        PageError(500, "Console error", "the console failed on this request; see its log"),
    )


def create_app(settings: ConsoleSettings) -> Starlette:
    console = Console(settings, Channels(settings.session_target, settings.delivery_target))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.channels.open()

        def channel() -> grpc.aio.Channel:
            assert console.channels.session is not None
            return console.channels.session

        console.hub = LiveHub(channel)
        try:
            yield
        finally:
            await console.hub.close()
            await console.channels.close()

    routes = [
        Route("/", pages.timeline_page),
        Route("/login", actions.login_form, methods=["GET"]),
        Route("/login", actions.login, methods=["POST"]),
        Route("/logout", actions.logout, methods=["POST"]),
        Route("/live", actions.live),
        Route("/sessions", pages.sessions_page),
        Route("/sessions/{agent}/{session_id}", pages.session_page),
        Route("/deliveries", pages.deliveries_page),
        Route("/deliveries/confirm", actions.deliveries_confirm, methods=["POST"]),
        Route("/deliveries/apply", actions.deliveries_apply, methods=["POST"]),
        Route("/rewind", actions.rewind_page, methods=["GET"]),
        Route("/rewind", actions.rewind_apply, methods=["POST"]),
        Route("/audit", pages.audit_page),
        Mount("/static", StaticFiles(directory=str(Path(__file__).parent / "static"))),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={
            PageError: _page_error,
            SwitchboardError: _service_error,
            NeedsLogin: _needs_login,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
        lifespan=lifespan,
    )
    app.state.console = console
    return app
