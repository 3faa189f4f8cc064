"""Who is logged in: the operator's token kept server-side, keyed by a random cookie.

The browser holds only the login's id, in an HttpOnly, SameSite=Strict cookie; the
token never reaches a URL, a page or a log. Each login has its own CSRF token, which
every form that changes something carries back.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

COOKIE = "switchboard_console"
#: A login unused this long is forgotten (its token with it).
IDLE_TIMEOUT_S = 8 * 3600.0
#: Logins kept at once; the least recently used one is forgotten past it.
MAX_LOGINS = 1000


@dataclass
class Login:
    token: str
    #: The token may call admin-only methods (or authentication is off).
    admin: bool
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    last_used: float = 0.0

    def csrf_matches(self, presented: str) -> bool:
        return hmac.compare_digest(self.csrf.encode(), presented.encode())


class Logins:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._by_id: dict[str, Login] = {}
        self._clock = clock

    def add(self, token: str, admin: bool) -> tuple[str, Login]:
        """A new login and the cookie value naming it."""
        self._forget_idle()
        while len(self._by_id) >= MAX_LOGINS:
            oldest = min(self._by_id, key=lambda key: self._by_id[key].last_used)
            del self._by_id[oldest]
        login_id = secrets.token_urlsafe(32)
        login = Login(token=token, admin=admin, last_used=self._clock())
        self._by_id[login_id] = login
        return login_id, login

    def get(self, login_id: str | None) -> Login | None:
        if not login_id:
            return None
        login = self._by_id.get(login_id)
        if login is None:
            return None
        now = self._clock()
        if now - login.last_used > IDLE_TIMEOUT_S:
            del self._by_id[login_id]
            return None
        login.last_used = now
        return login

    def remove(self, login_id: str | None) -> Login | None:
        return self._by_id.pop(login_id or "", None)

    def _forget_idle(self) -> None:
        now = self._clock()
        for login_id in [k for k, v in self._by_id.items() if now - v.last_used > IDLE_TIMEOUT_S]:
            del self._by_id[login_id]
