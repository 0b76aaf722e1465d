"""The upstream `logstream.sqlite3` schema, logsync's own tables, and the migrations.

The DDL of `events`, `artifacts` and `event_artifacts` is MemPalace's, column
for column, so either program opens a store the other wrote. Migrations are
named, ordered and idempotent; a store from a release without provenance or
topic columns gets them, and its rows are backfilled as authored here (as
upstream does). A store without the per-origin hash chain gets the ``logsync_chain``
table here; ``Store.open`` then computes the missing chain entries (one transaction).
A chain table from before signatures gets its ``signature`` column, and every store the
``logsync_keys`` keyring (``keyring.py``); MemPalace ignores both. A conflicts ledger from
before `logsync conflicts review` gets its nullable ``reviewed_at`` column; reads do not
need it (a read-only open of an older store lists every conflict as unreviewed), so its
absence is not a `schema_problem`.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from logsync import hlc as hlc_mod
from logsync.model import ROW_COLUMNS
from logsync.store.chaining import CHAIN_DDL, add_signature_column
from logsync.store.keyring import create_keys_table

EVENT_COLUMNS = ", ".join(ROW_COLUMNS)
INSERT_EVENT = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES ({', '.join('?' * 17)})"
INSERT_ARTIFACT = (
    "INSERT INTO artifacts (id, kind, sha256, size_bytes, content, created_by, created_at, "
    "metadata_json, origin_replica) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
FILTER_COLUMNS = ("stream", "room", "topic", "type", "from_agent", "correlation_id", "status")

UPSTREAM_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY,
    type TEXT NOT NULL,
    stream TEXT NOT NULL,
    room TEXT NOT NULL,
    topic TEXT,
    from_agent TEXT NOT NULL,
    to_agent TEXT,
    correlation_id TEXT,
    branch TEXT,
    base_commit TEXT,
    status TEXT,
    body TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    metadata_json TEXT NOT NULL DEFAULT '{}',
    origin_replica TEXT,
    origin_seq INTEGER,
    hlc TEXT
);
CREATE INDEX IF NOT EXISTS events_stream_created_idx ON events(stream, created_at);
CREATE INDEX IF NOT EXISTS events_correlation_idx ON events(correlation_id, created_at);
CREATE INDEX IF NOT EXISTS events_to_agent_idx ON events(to_agent, created_at);
CREATE INDEX IF NOT EXISTS events_type_idx ON events(type, created_at);
CREATE TABLE IF NOT EXISTS artifacts (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    content TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    metadata_json TEXT NOT NULL DEFAULT '{}',
    origin_replica TEXT
);
CREATE INDEX IF NOT EXISTS artifacts_sha256_idx ON artifacts(sha256);
CREATE TABLE IF NOT EXISTS event_artifacts (
    event_id TEXT NOT NULL,
    artifact_id TEXT NOT NULL,
    PRIMARY KEY (event_id, artifact_id)
);
"""

LOGSYNC_SCHEMA = """
CREATE TABLE IF NOT EXISTS logsync_conflicts (
    id INTEGER PRIMARY KEY,
    detected_at TEXT NOT NULL,
    kind TEXT NOT NULL,
    origin_replica TEXT,
    origin_seq INTEGER,
    item_id TEXT,
    reason TEXT NOT NULL,
    local_json TEXT,
    remote_json TEXT NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    times_seen INTEGER NOT NULL DEFAULT 1,
    reviewed_at TEXT
);
CREATE TABLE IF NOT EXISTS logsync_quarantine (
    id INTEGER PRIMARY KEY,
    received_at TEXT NOT NULL,
    kind TEXT NOT NULL,
    origin_replica TEXT,
    origin_seq INTEGER,
    item_id TEXT,
    reason TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    times_seen INTEGER NOT NULL DEFAULT 1
);
"""


HEALTH_SCHEMA = """
CREATE TABLE IF NOT EXISTS logsync_health (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    checked_at TEXT NOT NULL
)
"""
# One row, rewritten by `Store.health_problem`: a real write that proves the disk takes one.
HEALTH_UPSERT = (
    "INSERT INTO logsync_health (id, checked_at) VALUES (1, ?) "
    "ON CONFLICT(id) DO UPDATE SET checked_at = excluded.checked_at"
)
REQUIRED_TABLES = (
    "events", "artifacts", "event_artifacts", "logsync_conflicts", "logsync_quarantine",
    "logsync_health", "logsync_chain", "logsync_keys",
)
PROVENANCE_COLUMNS = ("topic", "origin_replica", "origin_seq", "hlc")
REVIEWED_COLUMN = "reviewed_at"  # logsync_conflicts: optional for reads (see the docstring)


def migrate(conn: sqlite3.Connection, replica_id: str) -> None:
    """Bring any upstream or logsync store to the current schema (inside a transaction)."""
    create_upstream_tables(conn)
    add_provenance_columns(conn)
    backfill_provenance(conn, replica_id)
    create_upstream_indexes(conn)
    create_logsync_tables(conn)
    add_reviewed_column(conn)
    create_health_table(conn)
    create_chain_table(conn)
    add_signature_column(conn)
    create_keys_table(conn)


def schema_problem(conn: sqlite3.Connection) -> str | None:
    """What a migration would still have to do (None when the schema is current).

    Read-only opens call this instead of ``migrate``: it only reads the catalogue.
    """
    tables = {
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    missing = [t for t in REQUIRED_TABLES if t not in tables]
    if missing:
        return f"lacks the tables {', '.join(missing)} (it needs a schema migration)"
    columns = _columns(conn, "events")
    absent = [c for c in PROVENANCE_COLUMNS if c not in columns]
    if absent or "origin_replica" not in _columns(conn, "artifacts"):
        return "lacks the provenance columns (it needs a schema migration)"
    if "signature" not in _columns(conn, "logsync_chain"):
        return "lacks the logsync_chain signature column (it needs a schema migration)"
    unstamped = conn.execute(
        "SELECT 1 FROM events WHERE origin_replica IS NULL LIMIT 1"
    ).fetchone()
    if unstamped is not None:
        return "holds events without provenance (it needs a schema migration)"
    return None


def create_upstream_tables(conn: sqlite3.Connection) -> None:
    for statement in UPSTREAM_SCHEMA.split(";"):
        if statement.strip() and "CREATE TABLE" in statement:
            conn.execute(statement)


# Columns every logstream's tables have had (migrations add the others): a database whose
# table of that name lacks one belongs to another application.
LOGSTREAM_MARKS = {"events": ("id", "type", "stream", "created_at"),
                   "artifacts": ("id", "sha256", "content")}


def foreign_database(db: Path) -> str | None:
    """Why the SQLite file `db` is another application's (read only, nothing created),
    else None: also when it is missing or no database at all (the open says so)."""
    if not db.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        try:
            for table, needed in LOGSTREAM_MARKS.items():
                columns = _columns(conn, table)
                absent = [c for c in needed if c not in columns]
                if columns and absent:
                    return (f"{db} is not a logstream store: its {table} table has no column "
                            f"{', '.join(absent)} (another application's database?); logsync "
                            "leaves it as it is")
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return None


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def add_provenance_columns(conn: sqlite3.Connection) -> None:
    """Stores from releases before provenance/topic get the columns added."""
    have = _columns(conn, "events")
    for name, kind in (
        ("topic", "TEXT"),
        ("origin_replica", "TEXT"),
        ("origin_seq", "INTEGER"),
        ("hlc", "TEXT"),
    ):
        if name not in have:
            conn.execute(f"ALTER TABLE events ADD COLUMN {name} {kind}")
    if "origin_replica" not in _columns(conn, "artifacts"):
        conn.execute("ALTER TABLE artifacts ADD COLUMN origin_replica TEXT")


def backfill_provenance(conn: sqlite3.Connection, replica_id: str) -> None:
    """Rows without provenance were authored here: seq = rowid, HLC from created_at."""
    rows = conn.execute(
        "SELECT rowid, created_at FROM events WHERE origin_replica IS NULL"
    ).fetchall()
    for row in rows:
        ms = _created_at_ms(row["created_at"])
        stamp = hlc_mod.render(ms, min(row["rowid"], hlc_mod.MAX_COUNTER), replica_id)
        conn.execute(
            "UPDATE events SET origin_replica = ?, origin_seq = rowid, hlc = ? WHERE rowid = ?",
            (replica_id, stamp, row["rowid"]),
        )
    conn.execute(
        "UPDATE artifacts SET origin_replica = ? WHERE origin_replica IS NULL", (replica_id,)
    )


def create_upstream_indexes(conn: sqlite3.Connection) -> None:
    for statement in UPSTREAM_SCHEMA.split(";"):
        if "CREATE INDEX" in statement:
            conn.execute(statement)
    conn.execute("CREATE INDEX IF NOT EXISTS events_topic_created_idx ON events(topic, created_at)")
    conn.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS events_origin_seq_idx "
        "ON events(origin_replica, origin_seq)"
    )
    conn.execute("CREATE INDEX IF NOT EXISTS events_hlc_idx ON events(hlc)")


def create_logsync_tables(conn: sqlite3.Connection) -> None:
    for statement in LOGSYNC_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def add_reviewed_column(conn: sqlite3.Connection) -> None:
    """``logsync_conflicts.reviewed_at`` (when `logsync conflicts review` marked a row; NULL:
    not yet), last like a new table's, so both orders of columns agree."""
    if REVIEWED_COLUMN not in _columns(conn, "logsync_conflicts"):
        conn.execute(f"ALTER TABLE logsync_conflicts ADD COLUMN {REVIEWED_COLUMN} TEXT")


def create_health_table(conn: sqlite3.Connection) -> None:
    """The one-row table ``Store.health_problem`` writes to (ignored by MemPalace)."""
    conn.execute(HEALTH_SCHEMA)


def create_chain_table(conn: sqlite3.Connection) -> None:
    """``logsync_chain``: one digest per held op (issue 10; MemPalace ignores the table).
    ``chaining.backfill_chains`` fills it: ``Store.open`` runs it after the integrity
    check (a corrupt file is reported as corrupt, not as a failed backfill)."""
    conn.execute(CHAIN_DDL)


def _created_at_ms(value: str) -> int:
    try:
        moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except (TypeError, ValueError):
        return 0
    return int(moment.timestamp() * 1000)
