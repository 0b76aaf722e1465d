"""Store faults in one sentence: which file, what happened, how to recover."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from logsync.errors import StoreError

BUSY_TIMEOUT_S = 10.0

class StoreNeedsWrite(StoreError):
    """A read-only open found no store, no replica id, or a schema that must migrate."""


def _primary(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


RECOVERY = (
    "move it aside and re-pull from a peer into a new palace: "
    "logsync --palace NEW init && logsync --palace NEW sync --peer URL"
)


def corrupt_sentence(db_path: Path, detail: str) -> str:
    """The one line that says a store is corrupt and how to recover."""
    return f"the store file {db_path} is corrupt ({detail}): {RECOVERY}"


def describe_fault(db_path: Path, action: str, exc: sqlite3.Error) -> str:
    """One sentence naming the file and the cause of a SQLite failure."""
    code = _primary(exc)
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return f"cannot {action} {db_path}: the file is corrupt ({exc}): {RECOVERY}"
    causes = {
        sqlite3.SQLITE_FULL: "the disk is full",
        sqlite3.SQLITE_READONLY: "the file or its directory is read-only",
        sqlite3.SQLITE_PERM: "permission denied",
        sqlite3.SQLITE_CANTOPEN: "the file cannot be opened (missing, or the directory is "
        "not accessible)",
        sqlite3.SQLITE_BUSY: f"another process held the write lock past {BUSY_TIMEOUT_S:g} s",
        sqlite3.SQLITE_LOCKED: "the database is locked",
        sqlite3.SQLITE_IOERR: "an I/O error (the disk failed, is full, or the file is "
        "immutable)",
    }
    cause = causes.get(code) if code is not None else None
    return f"cannot {action} {db_path}: {cause + ' (' + str(exc) + ')' if cause else exc}"
