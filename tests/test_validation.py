"""switchboard.validation's text check against the definition it implements: a
text is refused when any character is a control (Cc) or format (Cf) character."""

from __future__ import annotations

import sys
import unicodedata

import pytest

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
