"""What every page shares: the console's parts, rendering, the login of a request,
parsing its parameters, and the checks a state-changing request passes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates
from switchboard_client.errors import SwitchboardError

from switchboard_console.clients import Channels, DeliveryCalls, SessionCalls
from switchboard_console.live import LiveHub
from switchboard_console.logins import COOKIE, Login, Logins
from switchboard_console.security import same_origin

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
MAX_SEQUENCE = 2**63 - 1


@dataclass(frozen=True)
class ConsoleSettings:
    session_target: str
    delivery_target: str
    listen: str = "127.0.0.1:8233"
    #: Refuse every write (rewinds, checkouts, delivery actions).
    read_only: bool = False


@dataclass
class Console:
    settings: ConsoleSettings
    channels: Channels
    logins: Logins = field(default_factory=Logins)
    hub: LiveHub | None = None


class PageError(Exception):
    """A request the console answers with an error page: a status, a title and what
    the person can do about it."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


class NeedsLogin(Exception):
    """No (or an expired) login: the page redirects to the login form."""


#: gRPC codes as HTTP statuses, and a title each, for the error page.
_STATUS_OF_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "Bad input"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "Out of range"),
    grpc.StatusCode.NOT_FOUND: (404, "Not found"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "Not allowed with this token"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "The services refused the token"),
    grpc.StatusCode.FAILED_PRECONDITION: (409, "Refused in this state"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "Exists already"),
    grpc.StatusCode.ABORTED: (409, "Changed meanwhile"),
    grpc.StatusCode.UNAVAILABLE: (503, "A service is unreachable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "A service did not answer in time"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (503, "A service is overloaded"),
}


def page_error_of(error: SwitchboardError) -> PageError:
    status, title = _STATUS_OF_CODE.get(error.code, (502, "A service failed"))
    reason = f" ({error.reason})" if error.reason else ""
    return PageError(status, title, f"{error.code.name}{reason}: {error.message}")


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def login_of(request: Request) -> Login:
    login = console_of(request).logins.get(request.cookies.get(COOKIE))
    if login is None:
        raise NeedsLogin()
    return login


def sessions(request: Request) -> SessionCalls:
    return console_of(request).channels.sessions(login_of(request).token)


def deliveries(request: Request) -> DeliveryCalls:
    return console_of(request).channels.deliveries(login_of(request).token)


def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    console = console_of(request)
    login = console.logins.get(request.cookies.get(COOKIE))
    context.update(
        login=login,
        read_only=console.settings.read_only,
        csrf=login.csrf if login else "",
        path=request.url.path,
    )
    return TEMPLATES.TemplateResponse(request, template, context, status_code=status)


def sequence_param(value: str | None, name: str) -> int | None:
    """A sequence from a query or form field: a whole number 1..2^63-1, or absent."""
    if value is None or value.strip() == "":
        return None
    text = value.strip()
    if not text.isdigit() or not 0 < int(text) <= MAX_SEQUENCE:
        raise PageError(
            400,
            "Bad input",
            f"{name} must be a sequence of the log: a whole number from 1 to {MAX_SEQUENCE}, "
            f"not {text[:40]!r}",
        )
    return int(text)


async def checked_form(request: Request) -> tuple[Login, FormData]:
    """The form of a state-changing request, after its checks: the console is not
    read-only, the request comes from one of its pages, and carries its login's CSRF
    token. Any failure is a refusal page; nothing is done."""
    console = console_of(request)
    if console.settings.read_only:
        raise PageError(
            403,
            "Read-only console",
            "this console was started with --read-only: it shows, and changes nothing",
        )
    if not same_origin(request.headers, request.url.scheme):
        raise PageError(403, "Refused", "this request did not come from a console page (origin)")
    login = login_of(request)
    form = await request.form()
    presented = form.get("csrf")
    if not isinstance(presented, str) or not login.csrf_matches(presented):
        raise PageError(
            403, "Refused", "this form's CSRF token is missing or stale: reload the page"
        )
    return login, form


def text_field(form: FormData, name: str, limit: int = 512) -> str:
    value = form.get(name, "")
    if not isinstance(value, str) or len(value) > limit:
        raise PageError(400, "Bad input", f"{name} must be text of at most {limit} characters")
    return value.strip()
