"""SQLite's `PRAGMA data_version` on a read-only connection of its own: a number that
changes when any other connection to the file commits (a read of the WAL index in shared
memory, no table touched). The server's `CommitWatch` polls it; the SQL stays here."""

from __future__ import annotations

import sqlite3
from pathlib import Path


class CommitProbe:
    """`version()` reads data_version, connecting on first use; `OSError`-like faults
    come out as `sqlite3.Error`, and the connection is dropped so the next call retries."""

    def __init__(self, db_path: Path, *, timeout: float) -> None:
        self._uri = f"{Path(db_path).resolve().as_uri()}?mode=ro"
        self._timeout = timeout
        self._conn: sqlite3.Connection | None = None

    def version(self) -> int:
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self._uri, uri=True, timeout=self._timeout)
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
