"""`logsync.text.is_unicode`: the one rule every entry point (peer names and URLs, the
CLI's arguments, an op's fields) refuses undecodable text by."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from logsync.text import is_unicode


@given(st.text())
def test_text_without_surrogates_is_unicode(value: str) -> None:
    assert is_unicode(value) == (not any(0xD800 <= ord(c) <= 0xDFFF for c in value))


@given(st.text(), st.integers(0xD800, 0xDFFF), st.text())
def test_a_lone_surrogate_anywhere_is_refused(before: str, point: int, after: str) -> None:
    assert not is_unicode(before + chr(point) + after)


def test_undecodable_bytes_as_python_keeps_them_are_refused() -> None:
    assert not is_unicode(b"ab\xffcd".decode("utf-8", "surrogateescape"))
    assert is_unicode("ab\u00ffcd")
