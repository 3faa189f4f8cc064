"""Request-building strategies: valid field values mixed with hostile ones.

A request is built field by field. Each `Field` has a strategy of valid values and
one of hostile values; `message` builds a message from a valid base and corrupts
one or a few fields at a time (single-field mutation reaches the checks behind
the first validated field far more often than corrupting every field at once).
Hostile values: path traversal, 10k-100k character strings, control characters
and unicode oddities, values one past a length limit, a trailing newline after a
valid value, enum numbers outside the enum, hundreds of repeated entries, garbage
and tampered page tokens, sequences and fences at the int64/uint64 edges, and
negative or huge durations. Requests also carry unknown fields now and then.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import duration_pb2
from google.protobuf.message import Message
from hypothesis import strategies as st

S = st.SearchStrategy

#: Examples per RPC and backend; SWITCHBOARD_FUZZ_EXAMPLES raises it for a long run.
EXAMPLES: Final = int(os.environ.get("SWITCHBOARD_FUZZ_EXAMPLES", "0") or 0) or 30


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


#: Leave the field unset (for message, optional and oneof fields).
OMIT: Final = _Omit()

TRAVERSAL: Final = (
    "../x",
    "/etc/passwd",
    "C:\\x",
    "a/../b",
    "..",
    "C:x",
    "c:/windows",
    "\\\\server\\share",
    "./a",
    "~/.ssh",
    "%2e%2e%2f",
    "a/b",
    "a\\b",
)
ODD: Final = (
    "",
    " ",
    "\x00",
    "a\x00b",
    "\x1b[31mred\x1b[0m",
    "\u202eexe.txt",
    "abc\u200b",
    "\ufeffbom",
    "\u2028",
    "line\nbreak",
    "tab\there",
    "\r\n",
    "\x7f",
    "😀",
    "👩\u200d👩\u200d👧",
    "e\u0301",
    "\U0010fffd",
    "\ue000",
    "ǅ",
    "İ",
    "ﬀ",
    "١٢٣",
    "MAIN",
    "null",
    "'; DROP TABLE x; --",
    "%s%n",
    "${jndi:x}",
)
#: Lengths just at and just past the limits the protos and the schema use.
EDGE_LENGTHS: Final = (24, 25, 32, 33, 63, 64, 65, 128, 129, 255, 256, 257, 512, 513, 1024, 1025)
LONG_UNITS: Final = ("a", "é", "😀", "\u202e", "/..", "\x00", "ab\n", "Z9_-")

UINT64_EDGES: Final = (0, 1, 2, 2**31 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1)
UINT32_EDGES: Final = (0, 1, 2, 999, 1000, 1001, 2**31 - 1, 2**31, 2**32 - 1)
INT64_EDGES: Final = (-1, -(2**63), 2**63 - 1, 0, 2**31)
ENUM_EDGES: Final = (-1, -(2**31), 2**31 - 1, 6, 9, 42, 99)


def long_text() -> S[str]:
    """10k-100k characters of one repeated unit (ASCII, accents, emoji, RTL, NUL...)."""
    return st.builds(
        lambda n, unit: (unit * n)[:n], st.integers(10_000, 100_000), st.sampled_from(LONG_UNITS)
    )


def edge_text() -> S[str]:
    return st.builds(
        lambda n, unit: unit * n, st.sampled_from(EDGE_LENGTHS), st.sampled_from(("a", "é", "0"))
    )


def short_hostile() -> S[str]:
    """Hostile strings short enough to repeat hundreds of times in one request."""
    return st.one_of(st.sampled_from(TRAVERSAL + ODD), weird_text())


def weird_text() -> S[str]:
    return st.text(
        st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Co", "Mn", "So"]),
        min_size=1,
        max_size=6,
    )


def hostile_text() -> S[str]:
    return st.one_of(
        st.sampled_from(TRAVERSAL + ODD),
        long_text(),
        edge_text(),
        weird_text(),
        st.text(max_size=24),
    )


@dataclass(frozen=True)
class Field:
    """The valid and the hostile values of one request field."""

    valid: S[Any]
    hostile: S[Any]

    def any(self) -> S[Any]:
        return st.one_of(self.valid, self.hostile)


def text(*valid: str, strategy: S[str] | None = None) -> Field:
    """A string field: some valid values (or a strategy of them) and the hostile pool,
    including each valid value with hostile text around it."""
    good = strategy if strategy is not None else st.sampled_from(valid)
    mixed = st.builds(
        lambda value, bad, where: bad + value if where else value + bad,
        good,
        st.sampled_from(TRAVERSAL + ODD + ("\n", "\x00", "/", "..")),
        st.booleans(),
    )
    return Field(good, st.one_of(hostile_text(), mixed, good.map(lambda v: v + "\n")))


def uint64(*valid: int) -> Field:
    good = st.sampled_from(valid) if valid else st.integers(0, 100)
    return Field(good, st.one_of(st.sampled_from(UINT64_EDGES), st.integers(0, 2**64 - 1)))


def uint32(*valid: int) -> Field:
    good = st.sampled_from(valid) if valid else st.integers(0, 100)
    return Field(good, st.one_of(st.sampled_from(UINT32_EDGES), st.integers(0, 2**32 - 1)))


def int64(*valid: int) -> Field:
    good = st.sampled_from(valid) if valid else st.integers(0, 2**31)
    return Field(good, st.one_of(st.sampled_from(INT64_EDGES), st.integers(-(2**63), 2**63 - 1)))


def enum(values: Sequence[int], invalid: Sequence[int] = ()) -> Field:
    """An enum field: accepted numbers, or `invalid` ones (e.g. UNSPECIFIED) and
    numbers outside the enum."""
    edges = [*invalid, *(n for n in ENUM_EDGES if n not in values)]
    outside = st.integers(-(2**31), 2**31 - 1).filter(lambda n: n not in values)
    return Field(st.sampled_from(list(values)), st.one_of(st.sampled_from(edges), outside))


def optional(field: Field) -> Field:
    """A message or optional field that is valid unset too."""
    return Field(st.one_of(st.just(OMIT), field.valid), field.hostile)


def boolean() -> Field:
    return Field(st.booleans(), st.booleans())


def fixed(value: Any) -> Field:
    """A field the fuzzer leaves alone (e.g. unset)."""
    return Field(st.just(value), st.just(value))


def duration(*valid_seconds: float, unset: bool = True) -> Field:
    def of(seconds: float) -> duration_pb2.Duration:
        value = duration_pb2.Duration()
        value.FromNanoseconds(round(seconds * 1e9))
        return value

    good: S[Any] = st.sampled_from([of(s) for s in valid_seconds])
    if unset:
        good = st.one_of(st.just(OMIT), good)
    edges = [
        duration_pb2.Duration(seconds=-1),
        duration_pb2.Duration(nanos=-1),
        duration_pb2.Duration(nanos=1),
        duration_pb2.Duration(seconds=1, nanos=-5),
        duration_pb2.Duration(seconds=-5, nanos=5),
        duration_pb2.Duration(),
        duration_pb2.Duration(seconds=10**10),
        duration_pb2.Duration(seconds=315_576_000_001),
        duration_pb2.Duration(seconds=2**62),
        duration_pb2.Duration(seconds=2**63 - 1, nanos=999_999_999),
        duration_pb2.Duration(seconds=-(2**63)),
    ]
    anything = st.builds(
        duration_pb2.Duration,
        seconds=st.integers(-(2**63), 2**63 - 1),
        nanos=st.integers(-999_999_999, 999_999_999),
    )
    return Field(good, st.one_of(st.sampled_from(edges), anything))


def _numbered(values: Sequence[str], count: int) -> list[str]:
    return [f"{values[i % len(values)]}{i}" for i in range(count)]


def string_list(item: Field, *valid: Sequence[str]) -> Field:
    """A repeated string: valid lists, lists with hostile items, hundreds of entries."""
    good: S[list[str]] = st.sampled_from([list(v) for v in valid]) if valid else st.just([])
    with_hostile = st.lists(st.one_of(item.valid, item.hostile), min_size=1, max_size=4)
    hundreds = st.builds(
        lambda items, n: _numbered(items, n),
        st.lists(item.valid, min_size=1, max_size=3),
        st.integers(100, 800),
    )
    repeated_same = st.builds(
        lambda v, n: [v] * n, st.one_of(item.valid, short_hostile()), st.integers(100, 400)
    )
    return Field(good, st.one_of(with_hostile, hundreds, repeated_same))


def repeated(item: Field, min_valid: int = 0, max_valid: int = 3) -> Field:
    """A repeated message: a few valid entries; hostile entries; hundreds of copies."""
    hostile_lists = st.builds(
        lambda good, bad, at: [*good[:at], bad, *good[at:]],
        st.lists(item.valid, max_size=2),
        item.hostile,
        st.integers(0, 2),
    )
    hundreds = st.builds(lambda v, n: [v] * n, item.valid, st.integers(100, 600))
    good = st.lists(item.valid, min_size=min_valid, max_size=max_valid)
    return Field(good, st.one_of(hostile_lists, hundreds))


def string_map(key: Field, value: Field, *valid: Mapping[str, str]) -> Field:
    """A map<string, string>: valid maps, hostile keys or values, hundreds of entries."""
    good: S[dict[str, str]] = st.sampled_from([dict(v) for v in valid]) if valid else st.just({})
    bad_entry = st.one_of(
        st.tuples(key.hostile, value.valid), st.tuples(key.valid, value.hostile)
    ).map(lambda kv: {kv[0]: kv[1]})
    hundreds = st.builds(
        lambda k, v, n: {f"{k}{i}": v for i in range(n)},
        key.valid,
        st.one_of(value.valid, short_hostile()),
        st.integers(33, 1500),
    )
    return Field(good, st.one_of(bad_entry, hundreds))


# -- messages -----------------------------------------------------------------------------


def _build(
    cls: type[Message],
    fields: Mapping[str, Field],
    base: S[Mapping[str, Any]],
    corrupt: bool,
    max_corrupt: int,
) -> S[Message]:
    names = sorted(fields)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        start = dict(draw(base))
        broken: set[str] = set()
        if corrupt:
            broken = draw(
                st.sets(st.sampled_from(names), min_size=1, max_size=min(max_corrupt, len(names)))
            )
        values: dict[str, Any] = {}
        for name in names:
            if name in broken:
                values[name] = draw(fields[name].hostile)
            elif name in start:
                values[name] = start[name]
            else:
                values[name] = draw(fields[name].valid)
        message: Message = cls(**{k: v for k, v in values.items() if v is not OMIT})
        return message

    return build()


def message(
    cls: type[Message],
    base: S[Mapping[str, Any]] | None = None,
    max_corrupt: int = 2,
    **fields: Field,
) -> Field:
    """A message field: valid messages, and valid ones with 1..max_corrupt fields corrupted.

    `base` draws correlated valid values (an agent with one of its sessions, an
    obligation with its holder's fence) that the per-field valid strategies would
    rarely combine by chance.
    """
    return message_of(cls, fields, base, max_corrupt)


def message_of(
    cls: type[Message],
    fields: Mapping[str, Field],
    base: S[Mapping[str, Any]] | None = None,
    max_corrupt: int = 2,
) -> Field:
    """`message` with the fields in a mapping."""
    start: S[Mapping[str, Any]] = base if base is not None else st.just({})
    if not fields:
        return Field(st.just(cls()), st.just(cls()))
    return Field(
        _build(cls, fields, start, False, max_corrupt),
        _build(cls, fields, start, True, max_corrupt),
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def unknown_fields() -> S[bytes]:
    """Wire bytes of fields no request message declares (numbers 5000 and up)."""
    varint = st.builds(
        lambda n, v: _varint(n << 3) + _varint(v),
        st.integers(5000, 2**29 - 1),
        st.integers(0, 2**64 - 1),
    )
    length_delimited = st.builds(
        lambda n, payload: _varint((n << 3) | 2) + _varint(len(payload)) + payload,
        st.integers(5000, 2**29 - 1),
        st.one_of(st.binary(max_size=64), st.integers(1, 200_000).map(lambda n: b"\x00" * n)),
    )
    return st.lists(st.one_of(varint, length_delimited), min_size=1, max_size=5).map(b"".join)


def with_unknown_fields(message: Message, junk: bytes) -> Message:
    copy = type(message)()
    copy.CopyFrom(message)
    copy.MergeFromString(junk)
    return copy


def request(field: Field) -> S[Message]:
    """Mostly hostile requests, some fully valid ones; now and then with unknown fields."""
    body = st.one_of(field.valid, *[field.hostile] * 5)
    return st.one_of(
        body,
        body,
        body,
        st.builds(with_unknown_fields, body, unknown_fields()),
    )


def empty_request(cls: type[Message]) -> S[Message]:
    """A request without fields: the message itself, or one carrying unknown fields."""
    return st.one_of(
        st.just(cls()), st.builds(lambda junk: with_unknown_fields(cls(), junk), unknown_fields())
    )


# -- page tokens --------------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def token_payload(token: str) -> Any:
    """What a page token decodes to (this service's tokens are base64 JSON), or None."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        return json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        return None


def json_values() -> S[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.sampled_from([10**400, -(10**400), 2**63, 2**64, -(2**63) - 1, 1e308, "12", ""]),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=6,
    )


def _tampered(token: str, position: Any) -> str:
    payload = token_payload(token)
    if not isinstance(payload, dict):
        return token
    return _b64(json.dumps({**payload, "p": position}).encode())


def _nested(depth: int, fingerprint: str) -> str:
    return _b64(('{"p":' + "[" * depth + "]" * depth + f',"f":"{fingerprint}"}}').encode())


def page_token(issued: Sequence[str], foreign: Sequence[str] = ()) -> Field:
    """Page tokens: empty or issued by this listing; garbage, truncated, foreign
    (another listing's) and tampered ones (an issued token with another position)."""
    real = [t for t in issued if t]
    good = st.sampled_from(["", *real])
    garbage = st.one_of(
        st.binary(max_size=64).map(_b64),
        st.text(max_size=40),
        st.sampled_from(["not-a-token", "====", "e30", _b64(b"[]"), _b64(b'{"p":1}')]),
        long_text(),
    )
    options: list[S[str]] = [garbage]
    if foreign:
        options.append(st.sampled_from(list(foreign)))
    if real:
        source = st.sampled_from(real)
        options += [
            source.map(lambda t: t[:-3]),
            source.map(lambda t: t + "=="),
            source.map(lambda t: t[::-1]),
            st.builds(_tampered, source, st.lists(json_values(), max_size=3)),
            st.builds(_tampered, source, json_values()),
            st.builds(
                lambda t, depth: _nested(depth, str((token_payload(t) or {}).get("f", ""))),
                source,
                st.sampled_from([50, 2000, 100_000]),
            ),
        ]
    return Field(good, st.one_of(options))


def union(*fields: Field) -> Field:
    """One of several shapes (e.g. the bodies of a oneof)."""
    return Field(st.one_of([f.valid for f in fields]), st.one_of([f.hostile for f in fields]))


def tampered_token(token: str, position: Any) -> str:
    """An issued token whose position is replaced (its filter fingerprint kept)."""
    return _tampered(token, position)


def nested_token(token: str, depth: int) -> str:
    """A token (with an issued token's fingerprint) whose position nests `depth` lists."""
    return _nested(depth, str((token_payload(token) or {}).get("f", "")))
