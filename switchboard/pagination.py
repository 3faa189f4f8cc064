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
import math
from collections.abc import Iterable
from typing import Any

from switchboard.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
#: Pages and claim batches stay below gRPC's default 4 MiB receive limit, whatever
#: their size in rows: a client must be able to read every answer it asks for.
MAX_ANSWER_BYTES = 3 * 1024 * 1024


def page_size(requested: int) -> int:
    """0 means the default; larger than the maximum is served as the maximum."""
    if requested < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def fitting(sizes: Iterable[int], budget: int = MAX_ANSWER_BYTES) -> int:
    """How many leading items fit in `budget` bytes; never none, so paging moves on."""
    total = count = 0
    for size in sizes:
        total += size
        if total > budget and count:
            break
        count += 1
    return count


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
    except (binascii.Error, ValueError, KeyError, TypeError, RecursionError) as exc:
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


def position_of(token: str, filters: Any, *kinds: type) -> list[Any] | None:
    """The decoded position, each part converted to its kind (int parts must fit
    int64); None for the first page. A tampered token is INVALID_ARGUMENT."""
    position = decode(token, filters)
    if position is None:
        return None
    try:
        if len(position) != len(kinds):
            raise ValueError("wrong length")
        converted = [kind(part) for kind, part in zip(kinds, position, strict=True)]
        if any(isinstance(part, int) and abs(part) > 2**63 - 1 for part in converted):
            raise ValueError("out of range")
        if any(isinstance(part, float) and not math.isfinite(part) for part in converted):
            raise ValueError("not finite")
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument("page_token", "is malformed", reason="INVALID_PAGE_TOKEN") from exc
    return converted
