"""The console's browser-side defences: response headers (a Content-Security-Policy
without inline scripts or styles) and the checks every state-changing request
passes (its origin, then its login's CSRF token)."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # Same-origin requests keep their Origin header (no-referrer would send "null").
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


class SecurityHeaders:
    """Adds `HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {key.lower() for key, _ in message.get("headers", [])}
                extra = [
                    (name.encode(), value.encode())
                    for name, value in HEADERS.items()
                    if name.encode() not in present
                ]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)


def same_origin(headers: Headers, scheme: str) -> bool:
    """Whether a request comes from one of the console's own pages: its Origin (or,
    without one, its Referer) names the host it was sent to. A request with neither
    is refused: every browser sends Origin on a form POST."""
    host = headers.get("host", "")
    claimed = headers.get("origin") or headers.get("referer") or ""
    if not host or not claimed or claimed == "null":
        return False
    parts = urlsplit(claimed)
    return parts.scheme == scheme and parts.netloc == host
