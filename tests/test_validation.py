"""switchboard.validation's text check against the definition it implements: a
text is refused when any character is a control (Cc) or format (Cf) character."""

from __future__ import annotations

import sys
import unicodedata

import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from switchboard import validation
from switchboard.errors import InvalidArgument


def _defined(value: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf") for ch in value)


def test_every_code_point_is_judged_as_its_category_says() -> None:
    # The quick path trusts str.isprintable(); this holds it to the definition for
    # every code point of this Python's Unicode database, alone and inside a text.
    wrong = [
        hex(point)
        for point in range(sys.maxunicode + 1)
        if validation._has_control_chars(f"a{chr(point)}b") != _defined(chr(point))
    ]
    assert wrong == []


@pytest.mark.parametrize(
    "value",
    [
        "plain text",
        "カタカナ\u3000全角スペース",
        "no\u00a0break",
        "tab\there",
        "zero\u200bwidth",
        "bell\x07",
    ],
)
def test_text_refuses_exactly_the_defined_characters(value: str) -> None:
    if _defined(value):
        with pytest.raises(InvalidArgument, match="control characters"):
            validation.text("content", value, max_len=100)
    else:
        assert validation.text("content", value, max_len=100) == value


def test_newlines_and_tabs_pass_where_allowed() -> None:
    assert validation.text("content", "a\nb\tc", max_len=10, allow_newlines=True) == "a\nb\tc"
    with pytest.raises(InvalidArgument):
        validation.text("content", "a\nb", max_len=10)


# -- durations and timestamps ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "nanos", "expected"),
    [
        (0, 0, 0.0),
        (90, 500_000_000, 90.5),
        (0, 999_999_999, 0.999999999),
        (
            validation.MAX_DURATION_SECONDS,
            999_999_999,
            validation.MAX_DURATION_SECONDS + 0.999999999,
        ),
    ],
)
def test_a_duration_in_normal_form_is_its_seconds(
    seconds: int, nanos: int, expected: float
) -> None:
    value = duration_pb2.Duration(seconds=seconds, nanos=nanos)
    assert validation.duration("lease_ttl", value) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("seconds", "nanos", "says"),
    [
        (0, 2_000_000_000, "within ±999,999,999"),
        (1, 1_000_000_000, "within ±999,999,999"),
        (0, -1_000_000_000, "within ±999,999,999"),
        (5, -1, "opposite signs"),
        (-5, 1, "opposite signs"),
        (validation.MAX_DURATION_SECONDS + 1, 0, "a Duration lies within"),
        (-(2**63), 0, "a Duration lies within"),
        (-1, 0, "must not be negative"),
        (0, -1, "must not be negative"),
    ],
)
def test_a_duration_out_of_normal_form_or_negative_is_refused_naming_the_field(
    seconds: int, nanos: int, says: str
) -> None:
    value = duration_pb2.Duration(seconds=seconds, nanos=nanos)
    with pytest.raises(InvalidArgument, match=says) as refused:
        validation.duration("lease_ttl", value)
    assert refused.value.field == "lease_ttl"
    if says != "must not be negative":
        with pytest.raises(ValueError):
            value.ToJsonString()  # protobuf's own definition of a valid Duration agrees


def test_a_duration_is_held_to_the_bounds_given() -> None:
    minute = duration_pb2.Duration(seconds=60)
    assert validation.duration("idle_after", minute, minimum_s=60, maximum_s=60) == 60
    with pytest.raises(InvalidArgument, match="at least 61 s"):
        validation.duration("idle_after", minute, minimum_s=61)
    with pytest.raises(InvalidArgument, match="at most 59 s"):
        validation.duration("idle_after", minute, maximum_s=59)


def test_a_timestamp_must_be_one_every_reader_can_read() -> None:
    first, last = validation.MIN_TIMESTAMP_SECONDS, validation.MAX_TIMESTAMP_SECONDS
    for seconds, nanos in ((first, 0), (last, 999_999_999), (0, 0)):
        stamp = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
        assert validation.timestamp("agent.create_time", stamp) is stamp
        stamp.ToJsonString()  # what protobuf itself can represent
    for seconds, nanos in ((first - 1, 0), (last + 1, 0), (0, -1), (0, 1_000_000_000)):
        stamp = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
        with pytest.raises(InvalidArgument) as refused:
            validation.timestamp("agent.create_time", stamp)
        assert refused.value.field == "agent.create_time"
        with pytest.raises(ValueError):
            stamp.ToJsonString()  # the same line as protobuf's own
