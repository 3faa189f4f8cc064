"""Field checks shared by both services; each failure names the field.

Two kinds of identifiers are checked differently on purpose (Hermes' lesson):
an identifier that may reach a file path or become a name is checked strictly
(no "..", "/", "\\", drive letter), while a logical routing key is checked
loosely, because Google Chat's `spaces/<id>/threads/<id>` keys legitimately
contain "/".
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence

from google.protobuf import duration_pb2, timestamp_pb2

from switchboard.errors import InvalidArgument

# Strict ids refuse any "X:" prefix (Windows drive-relative paths like "C:x");
# logical keys such as "s:abc" only refuse a real drive path ("C:", "C:\\", "C:/").
_DRIVE_PREFIX = re.compile(r"^[A-Za-z]:")
_DRIVE_PATH = re.compile(r"^[A-Za-z]:(?:[\\/]|$)")
_PLATFORM = re.compile(r"[a-z][a-z0-9_]{0,31}")


def _has_control_chars(value: str) -> bool:
    """Whether any character is a control (Cc) or format (Cf) character.

    `isprintable()` (C speed) is true only for strings without Cc and Cf characters
    (and without separators other than the space, surrogates or unassigned code
    points), so nearly every text is settled by it; the others (a no-break space,
    say) are looked at character by character. Per character in Python, a 100-byte
    message had cost ~140 k instructions per call."""
    if value.isprintable():
        return False
    return any(unicodedata.category(ch) in ("Cc", "Cf") for ch in value)


def text(
    field: str, value: str, *, max_len: int, required: bool = False, allow_newlines: bool = False
) -> str:
    """A human-readable string: bounded, no control characters."""
    if required and not value:
        raise InvalidArgument(field, "is required")
    if len(value) > max_len:
        raise InvalidArgument(field, f"is {len(value)} characters long; the limit is {max_len}")
    checked = value.replace("\n", "").replace("\t", "") if allow_newlines else value
    if _has_control_chars(checked):
        raise InvalidArgument(field, "contains control characters")
    return value


def path_safe_id(field: str, value: str, *, max_len: int = 128, required: bool = True) -> str:
    """An id that may reach a file path or become a name: strict."""
    text(field, value, max_len=max_len, required=required)
    if ".." in value or "/" in value or "\\" in value or _DRIVE_PREFIX.match(value):
        raise InvalidArgument(
            field, "must not contain '..', '/', '\\' or a drive letter", reason="UNSAFE_ID"
        )
    return value


def routing_key(field: str, value: str, *, max_len: int = 512) -> str:
    """A logical routing key (or a part of one): loose, '/' allowed inside; never '|',
    which joins the parts of an obligation id (`delivery_service.records`)."""
    text(field, value, max_len=max_len, required=True)
    if ".." in value or value.startswith(("/", "\\")) or _DRIVE_PATH.match(value):
        raise InvalidArgument(
            field,
            "must not contain '..' or start with '/', '\\' or a drive letter",
            reason="UNSAFE_KEY",
        )
    no_separator(field, value)
    return value


def no_separator(field: str, value: str) -> str:
    """Refuses '|': two different replies could otherwise share an obligation id."""
    if "|" in value:
        raise InvalidArgument(
            field,
            "must not contain '|' (it separates the parts of an obligation id)",
            reason="RESERVED_CHARACTER",
        )
    return value


def platform(field: str, value: str) -> str:
    if not _PLATFORM.fullmatch(value):
        raise InvalidArgument(
            field,
            f"{value[:40]!r} is not a platform name (lower-case letters, digits and '_', "
            "starting with a letter, at most 32)",
        )
    return value


def platforms(field: str, values: Sequence[str], *, max_count: int = 64) -> tuple[str, ...]:
    if len(values) > max_count:
        raise InvalidArgument(field, f"has {len(values)} entries; the limit is {max_count}")
    return tuple(sorted({platform(field, value) for value in values}))


def string_map(
    field: str, values: Mapping[str, str], *, max_entries: int = 32, max_value_len: int = 4096
) -> dict[str, str]:
    if len(values) > max_entries:
        raise InvalidArgument(field, f"has {len(values)} entries; the limit is {max_entries}")
    for key, value in values.items():
        text(f"{field}[{key[:40]!r}]", key, max_len=64, required=True)
        text(f"{field}[{key[:40]!r}]", value, max_len=max_value_len, allow_newlines=True)
    return dict(values)


def seconds(
    field: str, value: float, *, minimum: float = 0.0, maximum: float | None = None
) -> float:
    if value < minimum:
        if minimum == 0:
            raise InvalidArgument(field, f"is {value:g} s; it must not be negative")
        raise InvalidArgument(field, f"must be at least {minimum:g} s")
    if maximum is not None and value > maximum:
        raise InvalidArgument(field, f"must be at most {maximum:g} s")
    return value


#: The range of google.protobuf.Duration (duration.proto): about 10,000 years either way.
MAX_DURATION_SECONDS = 315_576_000_000
#: The range of google.protobuf.Timestamp (timestamp.proto): 0001-01-01 to 9999-12-31 UTC.
MIN_TIMESTAMP_SECONDS = -62_135_596_800
MAX_TIMESTAMP_SECONDS = 253_402_300_799
_NANOS_PER_SECOND = 1_000_000_000


def duration(
    field: str,
    value: duration_pb2.Duration,
    *,
    minimum_s: float = 0.0,
    maximum_s: float | None = None,
) -> float:
    """A google.protobuf.Duration as seconds, refused unless in the normal form
    duration.proto defines and within [minimum_s, maximum_s].

    Out of normal form (nanos past a second, or seconds and nanos of opposite signs)
    a value means different lengths to different readers: protobuf's own JSON and
    time conversions refuse it, and adding the parts up would silently accept it.
    (protobuf checks the same only inside its JSON conversion, with terser messages.)
    """
    whole, nanos = value.seconds, value.nanos
    if not -_NANOS_PER_SECOND < nanos < _NANOS_PER_SECOND:
        raise InvalidArgument(
            field,
            f"nanos is {nanos}; it must lie within ±999,999,999 (carry whole seconds into seconds)",
            reason="INVALID_DURATION",
        )
    if (whole > 0 > nanos) or (whole < 0 < nanos):
        raise InvalidArgument(
            field,
            f"seconds ({whole}) and nanos ({nanos}) have opposite signs; give both "
            "with the duration's sign",
            reason="INVALID_DURATION",
        )
    if abs(whole) > MAX_DURATION_SECONDS:
        raise InvalidArgument(
            field,
            f"seconds is {whole}; a Duration lies within ±{MAX_DURATION_SECONDS}",
            reason="INVALID_DURATION",
        )
    total = whole + nanos / _NANOS_PER_SECOND
    return seconds(field, total, minimum=minimum_s, maximum=maximum_s)


def timestamp(field: str, value: timestamp_pb2.Timestamp) -> timestamp_pb2.Timestamp:
    """A google.protobuf.Timestamp in the normal form timestamp.proto defines: nanos
    within 0-999,999,999 and a time between the years 1 and 9999 (what every reader,
    protobuf's JSON conversion included, can represent)."""
    if not 0 <= value.nanos < _NANOS_PER_SECOND:
        raise InvalidArgument(
            field,
            f"nanos is {value.nanos}; it must lie within 0-999,999,999",
            reason="INVALID_TIMESTAMP",
        )
    if not MIN_TIMESTAMP_SECONDS <= value.seconds <= MAX_TIMESTAMP_SECONDS:
        raise InvalidArgument(
            field,
            f"seconds is {value.seconds}; a Timestamp lies between the years 1 and 9999 "
            f"({MIN_TIMESTAMP_SECONDS} to {MAX_TIMESTAMP_SECONDS})",
            reason="INVALID_TIMESTAMP",
        )
    return value


MAX_INT64 = 2**63 - 1


def int64(field: str, value: int) -> int:
    """A uint64 field that storage keeps as a signed 64-bit integer."""
    if value > MAX_INT64:
        raise InvalidArgument(field, f"must be at most {MAX_INT64}")
    return value


#: A sealed reply target (the gateways' AES-256-GCM envelope): version byte 1, a 12-byte
#: nonce, then the ciphertext and its 16-byte tag. The services never open one.
SEALED_TARGET_VERSION = 1
MIN_SEALED_TARGET_BYTES = 1 + 12 + 1 + 16
MAX_SEALED_TARGET_BYTES = 1024


def sealed_target(field: str, value: bytes) -> bytes:
    """A reply target a gateway sealed: bounded, and in the envelope's shape, so that a
    target sent in clear by mistake is refused rather than stored (empty: none)."""
    if not value:
        return value
    if len(value) > MAX_SEALED_TARGET_BYTES:
        raise InvalidArgument(
            field,
            f"is {len(value)} bytes; a sealed reply target is at most "
            f"{MAX_SEALED_TARGET_BYTES} (seal only the platform, chat and thread)",
            reason="SEALED_TARGET_TOO_LARGE",
        )
    if value[0] != SEALED_TARGET_VERSION or len(value) < MIN_SEALED_TARGET_BYTES:
        raise InvalidArgument(
            field,
            f"is not a sealed reply target: byte 0 must be the envelope version "
            f"{SEALED_TARGET_VERSION}, then a 12-byte nonce, the ciphertext and its 16-byte "
            f"tag (at least {MIN_SEALED_TARGET_BYTES} bytes); seal the target with the "
            "gateways' reply key, never send it in clear",
            reason="SEALED_TARGET_MALFORMED",
        )
    return value
