"""The one rule for text logsync takes from outside: valid Unicode."""

from __future__ import annotations


def is_unicode(value: str) -> bool:
    """False for a lone surrogate: Python keeps undecodable bytes (an argument, a file
    name, JSON's `\\udcff`) as one, and every encoder logsync writes with (SQLite, JSON
    files, HTTP) refuses it, so it is refused where it enters."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
