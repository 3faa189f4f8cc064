"""Opaque, filter-bound page tokens for keyset pagination.

A token carries the sort key of the last row served and a fingerprint of the
filters it was issued for, so a token replayed with other filters is refused
instead of silently skipping rows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any

from switchboard.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size(requested: int) -> int:
    """0 means the default; larger than the maximum is served as the maximum."""
    if requested < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def fingerprint(filters: Any) -> str:
    encoded = json.dumps(filters, sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def encode(position: list[Any], filters: Any) -> str:
    payload = json.dumps({"p": position, "f": fingerprint(filters)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def decode(token: str, filters: Any) -> list[Any] | None:
    """The position a token resumes after; None for the first page."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        payload = json.loads(raw)
        position = payload["p"]
        issued_for = payload["f"]
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(
            "page_token", "is not a token this service issued", reason="INVALID_PAGE_TOKEN"
        ) from exc
    if not isinstance(position, list) or issued_for != fingerprint(filters):
        raise InvalidArgument(
            "page_token",
            "was issued for different filters; repeat the first call with these filters",
            reason="INVALID_PAGE_TOKEN",
        )
    return position
