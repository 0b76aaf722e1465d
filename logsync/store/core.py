"""The logstream store: the only module that speaks SQL.

The schema is MemPalace's `logstream.sqlite3` (tables `events`, `artifacts`,
`event_artifacts`, the unique `(origin_replica, origin_seq)` index), so either
program can open a store the other wrote. logsync adds two tables of its own
(`logsync_conflicts`, `logsync_quarantine`) and a migrations ledger; MemPalace
ignores them.

Rules kept here (DESIGN.md invariants 1-8):

- Locally authored events get a gap-free `origin_seq` (max + 1 inside the
  write transaction) and an HLC later than everything stored, committed with
  `synchronous=FULL`: they are the only copy that exists.
- `apply_remote` is one transaction per call, validates every op with the
  same rules as a local append, stores ops verbatim, never overwrites, records
  divergence as a conflict and bad ops in quarantine, and stops only the
  offending origin. Remote pages can be pulled again, so they commit with
  `synchronous=NORMAL`.
- `seq` (the rowid) is local arrival order, the delivery cursor; `hlc` is the
  fleet-wide merge order. Cursors never use HLC.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from logsync import hlc as hlc_mod
from logsync import model
from logsync.errors import NotFoundError, StoreError, ValidationError, shorten
from logsync.replica import get_replica_id

DB_FILENAME = "logstream.sqlite3"
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 500
MAX_WAIT_TIMEOUT_MS = 300_000
BUSY_TIMEOUT_S = 10.0

_EVENT_COLUMNS = (
    "id, type, stream, room, topic, from_agent, to_agent, correlation_id, branch, "
    "base_commit, status, body, created_at, metadata_json, origin_replica, origin_seq, hlc"
)
_INSERT_EVENT = f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES ({', '.join('?' * 17)})"
_INSERT_ARTIFACT = (
    "INSERT INTO artifacts (id, kind, sha256, size_bytes, content, created_by, created_at, "
    "metadata_json, origin_replica) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_FILTER_COLUMNS = ("stream", "room", "topic", "type", "from_agent", "correlation_id", "status")

_UPSTREAM_SCHEMA = """
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

_LOGSYNC_SCHEMA = """
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
    times_seen INTEGER NOT NULL DEFAULT 1
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

IdFactory = Callable[[str], str]


@dataclass(frozen=True)
class ApplyResult:
    """What one `apply_remote` call did."""

    applied: int = 0
    duplicates: int = 0
    conflicts: int = 0
    quarantined: int = 0
    artifacts_applied: int = 0
    high_water: dict[str, int] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)
    applied_per_origin: dict[str, int] = field(default_factory=dict)


@dataclass
class _ApplyState:
    """Mutable bookkeeping for one apply transaction."""

    now: str
    known_artifacts: set[str] = field(default_factory=set)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    conflicts: list[tuple[Any, ...]] = field(default_factory=list)
    quarantine: list[tuple[Any, ...]] = field(default_factory=list)
    applied_ids: set[str] = field(default_factory=set)
    duplicates: int = 0
    artifacts_applied: int = 0
    high_water: dict[str, int] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)
    per_origin: dict[str, int] = field(default_factory=dict)
    max_hlc: str | None = None


def default_id_factory(wall_ms: Callable[[], int]) -> IdFactory:
    """Upstream-shaped ids: `evt_YYYYmmddTHHMMSS_<12 hex>`."""

    def new_id(prefix: str) -> str:
        stamp = datetime.fromtimestamp(wall_ms() / 1000, UTC).strftime("%Y%m%dT%H%M%S")
        return f"{prefix}_{stamp}_{secrets.token_hex(6)}"

    return new_id


class Store:
    """One palace's logstream: a WAL SQLite file, many readers, one writer."""

    def __init__(
        self,
        palace: Path,
        replica_id: str,
        wall_ms: Callable[[], int],
        new_id: IdFactory,
    ) -> None:
        self.palace = palace
        self.db_path = palace / DB_FILENAME
        self.replica_id = replica_id
        self._wall_ms = wall_ms
        self._new_id = new_id
        self.clock = hlc_mod.HybridLogicalClock(replica_id, wall_ms)
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._conn_lock = threading.Lock()
        self._closed = False
        self._writer = self._connect()
        self._migrate()
        self._observe_stored_max()

    # ── opening and closing ───────────────────────────────────────────

    @classmethod
    def open(
        cls,
        palace: str | os.PathLike[str],
        *,
        wall_ms: Callable[[], int] | None = None,
        new_id: IdFactory | None = None,
        replica_id: str | None = None,
    ) -> Store:
        """Open (creating if needed) the store in a palace directory."""
        palace_path = Path(palace).expanduser()
        try:
            palace_path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create palace directory {palace_path}: {exc}") from None
        try:
            palace_path.chmod(0o700)
        except OSError:
            pass
        wall = wall_ms or hlc_mod.system_wall_ms
        rid = replica_id or get_replica_id(palace_path)
        try:
            return cls(palace_path, rid, wall, new_id or default_id_factory(wall))
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open {palace_path / DB_FILENAME}: {exc}") from None

    def close(self) -> None:
        with self._conn_lock:
            self._closed = True
            for conn in self._connections:
                conn.close()
            self._connections.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        with self._conn_lock:
            if self._closed:
                conn.close()
                raise StoreError(f"store {self.db_path} is closed")
            self._connections.append(conn)
        return conn

    def _reader(self) -> sqlite3.Connection:
        """One read connection per thread: WAL readers never block the writer."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    @contextmanager
    def _atomic(self, *, durable: bool) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE serialises writers across processes."""
        with self._write_lock:
            conn = self._writer
            try:
                conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreError(f"cannot write to {self.db_path}: {exc}") from None
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                conn.execute("ROLLBACK")
                raise StoreError(f"cannot commit to {self.db_path}: {exc}") from None

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self._reader().execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            raise StoreError(f"cannot read {self.db_path}: {exc}") from None

    # ── migrations (named, ordered, each idempotent) ──────────────────

    def _migrate(self) -> None:
        with self._atomic(durable=True) as conn:
            for step in (_create_upstream_tables, _add_provenance_columns):
                step(conn)
            _backfill_provenance(conn, self.replica_id)
            for step in (_create_upstream_indexes, _create_logsync_tables):
                step(conn)

    def _observe_stored_max(self) -> None:
        """Seed the clock from the newest stamp within the drift bound."""
        ceiling = hlc_mod.drift_ceiling(self._wall_ms())
        row = self._read("SELECT max(hlc) AS top FROM events WHERE hlc < ?", (ceiling,))
        if row and row[0]["top"]:
            self.clock.observe(row[0]["top"])

    # ── local writes ──────────────────────────────────────────────────

    def append_event(
        self,
        type: str,
        stream: str,
        room: str,
        from_agent: str,
        *,
        to_agent: str | None = None,
        correlation_id: str | None = None,
        branch: str | None = None,
        base_commit: str | None = None,
        status: str | None = None,
        body: str | None = "",
        metadata: Mapping[str, Any] | None = None,
        artifact_ids: Sequence[str] | None = None,
        topic: str | None = None,
    ) -> dict[str, Any]:
        """Append one immutable event authored by this replica."""
        fields = model.validate_local_event(
            model.strip_routing(
                {
                    "type": type, "stream": stream, "room": room, "from_agent": from_agent,
                    "to_agent": to_agent, "correlation_id": correlation_id, "branch": branch,
                    "base_commit": base_commit, "status": status, "body": body,
                    "metadata": metadata,
                    "artifact_ids": artifact_ids,
                    "topic": topic,
                }
            )
        )
        with self._atomic(durable=True) as conn:
            for artifact_id in fields["artifact_ids"]:
                if not conn.execute("SELECT 1 FROM artifacts WHERE id = ?", (artifact_id,)).fetchone():
                    raise ValidationError(
                        f"artifact_ids names {artifact_id!r}, which is not stored here: "
                        "put the artifact first"
                    )
            event_id = self._insert_local_event(conn, fields)
        return self._event_by_id(event_id)

    def _insert_local_event(self, conn: sqlite3.Connection, fields: dict[str, Any]) -> str:
        ceiling = hlc_mod.drift_ceiling(self._wall_ms())
        top = conn.execute("SELECT max(hlc) FROM events WHERE hlc < ?", (ceiling,)).fetchone()[0]
        if top:
            self.clock.observe(top)
        seq = conn.execute(
            "SELECT coalesce(max(origin_seq), 0) + 1 FROM events WHERE origin_replica = ?",
            (self.replica_id,),
        ).fetchone()[0]
        event_id = self._new_id("evt")
        row = (
            event_id, fields["type"], fields["stream"], fields["room"], fields["topic"],
            fields["from_agent"], fields["to_agent"], fields["correlation_id"],
            fields["branch"], fields["base_commit"], fields["status"], fields["body"],
            model.utc_now_iso(self._wall_ms()), fields["metadata_json"], self.replica_id,
            seq, self.clock.tick(),
        )
        try:
            conn.execute(_INSERT_EVENT, row)
        except sqlite3.IntegrityError:
            raise StoreError(f"event id {event_id!r} already exists; the id factory repeated") from None
        conn.executemany(
            "INSERT INTO event_artifacts (event_id, artifact_id) VALUES (?, ?)",
            [(event_id, a) for a in fields["artifact_ids"]],
        )
        return event_id

    def put_artifact(
        self,
        kind: str,
        content: str,
        created_by: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Store exact content; the record returned omits the content itself."""
        kind = model.artifact_kind(kind)
        content = model.artifact_content(content)
        created_by_clean = model.routing(
            "created_by", created_by.strip() if isinstance(created_by, str) else created_by,
            required=True,
        )
        meta = model.metadata_json(metadata)
        raw_len = len(content.encode("utf-8"))
        record = {
            "id": self._new_id("art"), "kind": kind, "sha256": model.sha256_hex(content),
            "size_bytes": raw_len, "created_by": created_by_clean,
            "created_at": model.utc_now_iso(self._wall_ms()), "origin_replica": self.replica_id,
        }
        with self._atomic(durable=True) as conn:
            conn.execute(
                _INSERT_ARTIFACT,
                (record["id"], kind, record["sha256"], raw_len, content, created_by_clean,
                 record["created_at"], meta, self.replica_id),
            )
        warnings = model.patch_warnings(kind, content)
        if warnings:
            record["warnings"] = warnings
        return record

    def ack_event(
        self,
        event_id: str,
        from_agent: str,
        status: str | None = None,
        body: str | None = "",
        topic: str | None = None,
    ) -> dict[str, Any]:
        """Append `event.ack` routed back to the target's author; the target is untouched."""
        target = self._event_by_id(model.identifier("event_id", event_id))
        return self.append_event(
            model.ACK_EVENT_TYPE, target["stream"], target["room"], from_agent,
            to_agent=target["from_agent"],
            correlation_id=target["correlation_id"] or target["id"],
            status=status, body=body, metadata={"ack_of": target["id"]},
            topic=topic if topic is not None else target["topic"],
        )

    def submit_patch(
        self,
        content: str,
        from_agent: str,
        stream: str,
        room: str = "patches",
        *,
        to_agent: str | None = None,
        correlation_id: str | None = None,
        branch: str | None = None,
        base_commit: str | None = None,
        body: str | None = "",
        metadata: Mapping[str, Any] | None = None,
        topic: str | None = None,
    ) -> dict[str, Any]:
        """Store a patch artifact and its `patch.ready` event."""
        model.validate_local_event(
            model.strip_routing(
                {"type": "patch.ready", "stream": stream, "room": room, "from_agent": from_agent,
                 "to_agent": to_agent, "correlation_id": correlation_id, "branch": branch,
                 "base_commit": base_commit, "body": body, "metadata": metadata, "topic": topic}
            )
        )
        artifact = self.put_artifact("patch", content, from_agent, metadata)
        event = self.append_event(
            "patch.ready", stream, room, from_agent, to_agent=to_agent,
            correlation_id=correlation_id, branch=branch, base_commit=base_commit,
            status="ready", body=body, metadata=metadata, artifact_ids=[artifact["id"]],
            topic=topic,
        )
        return {"artifact": artifact, "event": event}

    # ── reads ─────────────────────────────────────────────────────────

    def get_artifact(self, artifact_id: str) -> dict[str, Any] | None:
        """One artifact with its exact content, or None."""
        rows = self._read("SELECT * FROM artifacts WHERE id = ?", (artifact_id,))
        return _artifact_dict(rows[0]) if rows else None

    def get_artifacts(self, ids: Iterable[str]) -> list[dict[str, Any]]:
        """Several artifacts at once (unknown ids are left out), ordered by id."""
        wanted = sorted(set(ids))
        out: list[dict[str, Any]] = []
        for chunk in _chunks(wanted, 500):
            marks = ",".join("?" * len(chunk))
            rows = self._read(f"SELECT * FROM artifacts WHERE id IN ({marks}) ORDER BY id", chunk)
            out.extend(_artifact_dict(r) for r in rows)
        return out

    def missing_artifacts(self, ids: Iterable[str]) -> list[str]:
        """Which of these artifact ids this replica does not hold (sorted)."""
        wanted = sorted(set(ids))
        have: set[str] = set()
        for chunk in _chunks(wanted, 500):
            marks = ",".join("?" * len(chunk))
            rows = self._read(f"SELECT id FROM artifacts WHERE id IN ({marks})", chunk)
            have.update(r["id"] for r in rows)
        return [i for i in wanted if i not in have]

    def get_event(self, event_id: str) -> dict[str, Any] | None:
        rows = self._read("SELECT rowid, * FROM events WHERE id = ?", (event_id,))
        return self._attach(rows)[0] if rows else None

    def _event_by_id(self, event_id: str) -> dict[str, Any]:
        event = self.get_event(event_id)
        if event is None:
            raise NotFoundError(f"event {event_id!r} not found")
        return event

    def list_events(
        self,
        *,
        stream: str | None = None,
        room: str | None = None,
        topic: str | None = None,
        type: str | None = None,
        to_agent: str | None = None,
        from_agent: str | None = None,
        correlation_id: str | None = None,
        status: str | None = None,
        since_event_id: str | None = None,
        before_event_id: str | None = None,
        since_created_at: str | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
        order: str = "asc",
    ) -> list[dict[str, Any]]:
        """Filtered events; cursors are local seq, `order="hlc"` is the merged timeline."""
        where, params = self._filters(
            stream=stream, room=room, topic=topic, type=type, to_agent=to_agent,
            from_agent=from_agent, correlation_id=correlation_id, status=status,
            since_created_at=since_created_at,
        )
        for name, value, op in (("since_event_id", since_event_id, ">"),
                                ("before_event_id", before_event_id, "<")):
            if value not in (None, ""):
                where.append(f"rowid {op} ?")
                params.append(self._anchor(name, value))
        order_sql = _order_clause(order)
        sql = "SELECT rowid, * FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {order_sql} LIMIT ?"
        params.append(_clamp_limit(limit))
        return self._attach(self._read(sql, params))

    def _filters(self, **values: Any) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        for column in _FILTER_COLUMNS:
            value = values.get(column)
            if value in (None, ""):
                continue
            value = _check_filter(column, value)
            where.append(f"{column} = ?")
            params.append(value)
        to_agent = values.get("to_agent")
        if to_agent not in (None, ""):
            where.append("(to_agent = ? OR to_agent = '*')")
            params.append(model.routing("to_agent", to_agent, required=True))
        since = values.get("since_created_at")
        if since not in (None, ""):
            where.append("created_at >= ?")
            params.append(_check_since_created_at(since))
        return where, params

    def _anchor(self, name: str, event_id: str) -> int:
        rows = self._read("SELECT rowid FROM events WHERE id = ?", (event_id,))
        if not rows:
            raise NotFoundError(f"{name} {event_id!r} not found in this replica")
        return int(rows[0][0])

    def wait_events(
        self,
        timeout_ms: int = 60_000,
        *,
        poll_s: float = 0.05,
        **filters: Any,
    ) -> dict[str, Any]:
        """Long poll: the first matching events, or `{timed_out: true, events: []}`."""
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float) or timeout_ms < 0:
            raise ValidationError(
                f"timeout_ms={shorten(timeout_ms)} is invalid: must be a non-negative number"
            )
        deadline = time.monotonic() + min(timeout_ms, MAX_WAIT_TIMEOUT_MS) / 1000
        delay = poll_s
        while True:
            events = self.list_events(**filters)
            remaining = deadline - time.monotonic()
            if events:
                return {"timed_out": False, "events": events}
            if remaining <= 0:
                return {"timed_out": True, "events": []}
            time.sleep(min(delay, remaining))
            delay = min(delay * 1.5, 0.5)

    def latest_event_id(self) -> str | None:
        rows = self._read("SELECT id FROM events ORDER BY rowid DESC LIMIT 1")
        return rows[0]["id"] if rows else None

    def max_seq(self) -> int:
        """The newest local arrival cursor (0 when empty): a cheap change probe."""
        rows = self._read("SELECT coalesce(max(rowid), 0) FROM events")
        return int(rows[0][0])

    def events_after_seq(self, seq: int, limit: int = MAX_LIST_LIMIT) -> list[dict[str, Any]]:
        """Events with a local seq above `seq`, in arrival order (stream tailing)."""
        rows = self._read(
            "SELECT rowid, * FROM events WHERE rowid > ? ORDER BY rowid LIMIT ?", (seq, limit)
        )
        return self._attach(rows)

    def version_vector(self) -> dict[str, int]:
        rows = self._read(
            "SELECT origin_replica, max(origin_seq) AS top FROM events "
            "WHERE origin_replica IS NOT NULL GROUP BY origin_replica"
        )
        return {r["origin_replica"]: int(r["top"]) for r in rows if r["top"] is not None}

    def list_ops(
        self, origin: str, after: int = 0, limit: int = 500, *, max_limit: int = 500
    ) -> list[dict[str, Any]]:
        """Ops authored by `origin` with origin_seq > after, in author order."""
        origin = model.routing("origin", origin, required=True) or ""
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValidationError(f"after={shorten(after)} is invalid: must be a non-negative integer")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValidationError(f"limit={shorten(limit)} is invalid: must be a positive integer")
        rows = self._read(
            "SELECT rowid, * FROM events WHERE origin_replica = ? AND origin_seq > ? "
            "ORDER BY origin_seq LIMIT ?",
            (origin, after, min(limit, max_limit)),
        )
        return self._attach(rows)

    def iter_events(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        """Every event in arrival order, in bounded batches."""
        seq = 0
        while True:
            events = self.events_after_seq(seq, batch)
            if not events:
                return
            yield from events
            seq = events[-1]["seq"]

    def iter_artifacts(self) -> Iterator[dict[str, Any]]:
        last = ""
        while True:
            rows = self._read("SELECT * FROM artifacts WHERE id > ? ORDER BY id LIMIT 200", (last,))
            if not rows:
                return
            yield from (_artifact_dict(r) for r in rows)
            last = rows[-1]["id"]

    def counts(self) -> dict[str, int]:
        tables = (("events", "events"), ("artifacts", "artifacts"),
                  ("conflicts", "logsync_conflicts"), ("quarantined", "logsync_quarantine"))
        return {
            name: int(self._read(f"SELECT count(*) FROM {table}")[0][0]) for name, table in tables
        }

    def list_conflicts(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._read(
            "SELECT * FROM logsync_conflicts ORDER BY id DESC LIMIT ?", (_clamp_limit(limit),)
        )
        return [_ledger_dict(r, ("local_json", "remote_json")) for r in rows]

    def list_quarantine(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._read(
            "SELECT * FROM logsync_quarantine ORDER BY id DESC LIMIT ?", (_clamp_limit(limit),)
        )
        return [_ledger_dict(r, ("payload_json",)) for r in rows]

    def _attach(self, rows: Sequence[sqlite3.Row]) -> list[dict[str, Any]]:
        """Event dicts in upstream key order, artifact_ids sorted."""
        events = [_event_dict(r) for r in rows]
        if not events:
            return events
        by_id = {e["id"]: e for e in events}
        for chunk in _chunks(list(by_id), 500):
            marks = ",".join("?" * len(chunk))
            links = self._read(
                f"SELECT event_id, artifact_id FROM event_artifacts WHERE event_id IN ({marks}) "
                "ORDER BY artifact_id",
                chunk,
            )
            for link in links:
                by_id[link["event_id"]]["artifact_ids"].append(link["artifact_id"])
        return events

    # ── replication ───────────────────────────────────────────────────

    def apply_remote(
        self, events: Sequence[Any], artifacts: Sequence[Any] = ()
    ) -> ApplyResult:
        """Fold a page of remote ops (and the artifacts they name) in, in one transaction."""
        state = _ApplyState(now=model.utc_now_iso(self._wall_ms()))
        by_origin = _group_by_origin(events)
        with self._atomic(durable=False) as conn:
            self._apply_artifacts(conn, artifacts, state)
            for origin, ops in by_origin.items():
                self._apply_origin(conn, origin, ops, state)
            conn.executemany(_INSERT_EVENT, state.events)
            conn.executemany(
                "INSERT OR IGNORE INTO event_artifacts (event_id, artifact_id) VALUES (?, ?)",
                state.links,
            )
            _record_ledgers(conn, state)
        if state.max_hlc:
            self.clock.observe(state.max_hlc)
        return ApplyResult(
            applied=len(state.events), duplicates=state.duplicates,
            conflicts=len(state.conflicts), quarantined=len(state.quarantine),
            artifacts_applied=state.artifacts_applied, high_water=state.high_water,
            stopped=state.stopped, applied_per_origin=state.per_origin,
        )

    def _apply_artifacts(
        self, conn: sqlite3.Connection, artifacts: Sequence[Any], state: _ApplyState
    ) -> None:
        valid: dict[str, dict[str, Any]] = {}
        for raw in artifacts:
            try:
                art = model.validate_remote_artifact(raw)
            except ValidationError as exc:
                _quarantine(state, "artifact", raw, str(exc))
                continue
            valid.setdefault(art["id"], art)
        existing = _fetch_by_ids(conn, "SELECT * FROM artifacts WHERE id IN ({})", list(valid))
        rows = []
        for art_id, art in valid.items():
            have = existing.get(art_id)
            if have is None:
                rows.append((art_id, art["kind"], art["sha256"], art["size_bytes"],
                             art["content"], art["created_by"], art["created_at"],
                             art["metadata_json"], art["origin_replica"]))
            elif not _same_artifact(have, art):
                _conflict(state, "artifact", art_id, None, None,
                          "an artifact with this id but different content is already stored",
                          _artifact_dict(have), _artifact_wire(art))
            state.known_artifacts.add(art_id)
        conn.executemany(_INSERT_ARTIFACT, rows)
        state.artifacts_applied += len(rows)

    def _apply_origin(
        self, conn: sqlite3.Connection, origin: str, ops: list[Any], state: _ApplyState
    ) -> None:
        """Apply one origin's ops in origin_seq order, stopping at the first bad one."""
        seqs = [s for s in (_raw_seq(op) for op in ops) if s is not None]
        by_seq = _existing_by_seq(conn, origin, seqs)
        ids = [op.get("id") for op in ops if isinstance(op, Mapping) and isinstance(op.get("id"), str)]
        by_id = _fetch_by_ids(conn, "SELECT rowid, * FROM events WHERE id IN ({})", ids)
        top = conn.execute(
            "SELECT coalesce(max(origin_seq), 0) FROM events WHERE origin_replica = ?", (origin,)
        ).fetchone()[0]
        batch_keys: dict[int, dict[str, Any]] = {}
        for op in ops:
            try:
                row = model.validate_remote_event(op)
            except ValidationError as exc:
                self._stop(state, origin, _quarantine(state, "event", op, str(exc)))
                return
            outcome = self._classify(conn, row, op, by_seq, by_id, batch_keys, top, state)
            if outcome == "stop":
                return
            if outcome == "insert":
                batch_keys[row["origin_seq"]] = row
                self._stage_insert(row, state)
                top = max(top, row["origin_seq"])
        if origin != self.replica_id:
            state.high_water[origin] = max(top, state.high_water.get(origin, 0))

    def _classify(
        self,
        conn: sqlite3.Connection,
        row: dict[str, Any],
        op: Any,
        by_seq: dict[int, sqlite3.Row],
        by_id: dict[str, sqlite3.Row],
        batch: dict[int, dict[str, Any]],
        top: int,
        state: _ApplyState,
    ) -> str:
        """Decide one validated op: 'insert', 'skip' (duplicate/conflict) or 'stop'."""
        seq, origin = row["origin_seq"], row["origin_replica"]
        local = batch.get(seq)
        if local is None and seq in by_seq:
            local = self._stored_row(conn, by_seq[seq])
        if local is not None:
            if _same_event(local, row):
                state.duplicates += 1
                return "skip"
            _conflict(state, "fork", row["id"], origin, seq,
                      "the same (origin_replica, origin_seq) arrived with different content",
                      _row_wire(local), op)
            return "skip"
        if origin == self.replica_id:
            _conflict(state, "forged_origin", row["id"], origin, seq,
                      "an op claims this replica as its origin but this replica never wrote it",
                      None, op)
            return "skip"
        if row["id"] in by_id or row["id"] in state.applied_ids:
            have = by_id.get(row["id"])
            _conflict(state, "id_collision", row["id"], origin, seq,
                      "an event with this id already exists under another (origin, origin_seq)",
                      self._stored_row(conn, have) if have is not None else None, op)
            self._stop(state, origin, "id collision")
            return "stop"
        if seq <= top:
            _conflict(state, "history_rewrite", row["id"], origin, seq,
                      f"origin_seq {seq} is at or below this origin's high-water mark {top} "
                      "but was never held here: the origin's history changed", None, op)
            return "skip"
        missing = [a for a in row["artifact_ids"] if not self._has_artifact(conn, a, state)]
        if missing:
            reason = f"names artifact {missing[0]!r}, which is not present"
            self._stop(state, origin, _quarantine(state, "event", op, reason))
            return "stop"
        return "insert"

    def _stop(self, state: _ApplyState, origin: str, reason: str) -> None:
        state.stopped.setdefault(origin, reason)

    def _has_artifact(self, conn: sqlite3.Connection, art_id: str, state: _ApplyState) -> bool:
        if art_id in state.known_artifacts:
            return True
        found = conn.execute("SELECT 1 FROM artifacts WHERE id = ?", (art_id,)).fetchone()
        if found:
            state.known_artifacts.add(art_id)
        return bool(found)

    def _stored_row(self, conn: sqlite3.Connection, row: sqlite3.Row) -> dict[str, Any]:
        """A stored event in the validated-row shape, for content comparison."""
        links = conn.execute(
            "SELECT artifact_id FROM event_artifacts WHERE event_id = ? ORDER BY artifact_id",
            (row["id"],),
        ).fetchall()
        stored = {k: row[k] for k in row.keys() if k != "rowid"}
        stored["artifact_ids"] = [link[0] for link in links]
        return stored

    def _stage_insert(self, row: dict[str, Any], state: _ApplyState) -> None:
        state.events.append(
            (row["id"], row["type"], row["stream"], row["room"], row["topic"],
             row["from_agent"], row["to_agent"], row["correlation_id"], row["branch"],
             row["base_commit"], row["status"], row["body"], row["created_at"],
             row["metadata_json"], row["origin_replica"], row["origin_seq"], row["hlc"])
        )
        state.links.extend((row["id"], a) for a in row["artifact_ids"])
        state.applied_ids.add(row["id"])
        origin = row["origin_replica"]
        state.per_origin[origin] = state.per_origin.get(origin, 0) + 1
        if state.max_hlc is None or row["hlc"] > state.max_hlc:
            state.max_hlc = row["hlc"]


# ── migrations ────────────────────────────────────────────────────────


def _create_upstream_tables(conn: sqlite3.Connection) -> None:
    for statement in _UPSTREAM_SCHEMA.split(";"):
        if statement.strip() and "CREATE TABLE" in statement:
            conn.execute(statement)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _add_provenance_columns(conn: sqlite3.Connection) -> None:
    """Stores from releases before provenance/topic get the columns added."""
    have = _columns(conn, "events")
    for name, kind in (("topic", "TEXT"), ("origin_replica", "TEXT"),
                       ("origin_seq", "INTEGER"), ("hlc", "TEXT")):
        if name not in have:
            conn.execute(f"ALTER TABLE events ADD COLUMN {name} {kind}")
    if "origin_replica" not in _columns(conn, "artifacts"):
        conn.execute("ALTER TABLE artifacts ADD COLUMN origin_replica TEXT")


def _backfill_provenance(conn: sqlite3.Connection, replica_id: str) -> None:
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
    conn.execute("UPDATE artifacts SET origin_replica = ? WHERE origin_replica IS NULL",
                 (replica_id,))


def _create_upstream_indexes(conn: sqlite3.Connection) -> None:
    for statement in _UPSTREAM_SCHEMA.split(";"):
        if "CREATE INDEX" in statement:
            conn.execute(statement)
    conn.execute("CREATE INDEX IF NOT EXISTS events_topic_created_idx ON events(topic, created_at)")
    conn.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS events_origin_seq_idx "
        "ON events(origin_replica, origin_seq)"
    )
    conn.execute("CREATE INDEX IF NOT EXISTS events_hlc_idx ON events(hlc)")


def _create_logsync_tables(conn: sqlite3.Connection) -> None:
    for statement in _LOGSYNC_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def _created_at_ms(value: str) -> int:
    try:
        moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except (TypeError, ValueError):
        return 0
    return int(moment.timestamp() * 1000)


# ── row shaping and comparison ────────────────────────────────────────


def _event_dict(row: sqlite3.Row) -> dict[str, Any]:
    try:
        metadata = json.loads(row["metadata_json"])
    except (TypeError, ValueError):
        metadata = {}
    return {
        "id": row["id"], "seq": row["rowid"], "origin_replica": row["origin_replica"],
        "origin_seq": row["origin_seq"], "hlc": row["hlc"], "type": row["type"],
        "stream": row["stream"], "room": row["room"], "topic": row["topic"],
        "from_agent": row["from_agent"], "to_agent": row["to_agent"],
        "correlation_id": row["correlation_id"], "branch": row["branch"],
        "base_commit": row["base_commit"], "status": row["status"], "artifact_ids": [],
        "body": row["body"], "created_at": row["created_at"], "metadata": metadata,
    }


def _artifact_dict(row: sqlite3.Row) -> dict[str, Any]:
    try:
        metadata = json.loads(row["metadata_json"])
    except (TypeError, ValueError):
        metadata = {}
    return {
        "id": row["id"], "kind": row["kind"], "sha256": row["sha256"],
        "size_bytes": row["size_bytes"], "content": row["content"],
        "created_by": row["created_by"], "created_at": row["created_at"],
        "origin_replica": row["origin_replica"], "metadata": metadata,
    }


def _artifact_wire(art: dict[str, Any]) -> dict[str, Any]:
    out = {k: art[k] for k in model.ARTIFACT_KEYS if k != "metadata"}
    out["metadata"] = json.loads(art["metadata_json"])
    return out


def _row_wire(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k != "metadata_json"}
    out["metadata"] = _json_or_raw(row.get("metadata_json"))
    return out


_COMPARED = (
    "id", "type", "stream", "room", "topic", "from_agent", "to_agent", "correlation_id",
    "branch", "base_commit", "status", "body", "created_at", "origin_replica", "origin_seq",
    "hlc", "artifact_ids",
)


def _same_event(stored: dict[str, Any], incoming: dict[str, Any]) -> bool:
    if any(stored.get(k) != incoming.get(k) for k in _COMPARED):
        return False
    return _json_or_raw(stored.get("metadata_json")) == _json_or_raw(incoming["metadata_json"])


def _same_artifact(stored: sqlite3.Row, incoming: dict[str, Any]) -> bool:
    return (
        stored["sha256"] == incoming["sha256"]
        and stored["content"] == incoming["content"]
        and stored["kind"] == incoming["kind"]
    )


def _json_or_raw(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


# ── apply helpers ─────────────────────────────────────────────────────


def _raw_seq(op: Any) -> int | None:
    seq = op.get("origin_seq") if isinstance(op, Mapping) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def _group_by_origin(events: Sequence[Any]) -> dict[str, list[Any]]:
    """Ops per origin in origin_seq order; ops without a usable seq sort last."""
    groups: dict[str, list[tuple[float, int, Any]]] = {}
    for index, op in enumerate(events):
        origin = op.get("origin_replica") if isinstance(op, Mapping) else None
        key = origin if isinstance(origin, str) else f"<invalid:{shorten(origin, 40)}>"
        seq = _raw_seq(op)
        groups.setdefault(key, []).append((float("inf") if seq is None else seq, index, op))
    return {k: [op for _, _, op in sorted(v, key=lambda t: (t[0], t[1]))] for k, v in groups.items()}


def _existing_by_seq(
    conn: sqlite3.Connection, origin: str, seqs: list[int]
) -> dict[int, sqlite3.Row]:
    if not seqs:
        return {}
    rows = conn.execute(
        "SELECT rowid, * FROM events WHERE origin_replica = ? AND origin_seq BETWEEN ? AND ?",
        (origin, min(seqs), max(seqs)),
    ).fetchall()
    return {r["origin_seq"]: r for r in rows}


def _fetch_by_ids(conn: sqlite3.Connection, sql: str, ids: list[str]) -> dict[str, sqlite3.Row]:
    out: dict[str, sqlite3.Row] = {}
    for chunk in _chunks(sorted(set(ids)), 500):
        rows = conn.execute(sql.format(",".join("?" * len(chunk))), chunk).fetchall()
        out.update((r["id"], r) for r in rows)
    return out


def _payload(value: Any) -> str:
    """Verbatim JSON of what a peer sent; escaped where it holds lone surrogates."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=repr)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, sort_keys=True, default=repr)
    return text


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def _quarantine(state: _ApplyState, kind: str, item: Any, reason: str) -> str:
    payload = _payload(item)
    origin = item.get("origin_replica") if isinstance(item, Mapping) else None
    item_id = item.get("id") if isinstance(item, Mapping) else None
    state.quarantine.append((
        state.now, kind, origin if isinstance(origin, str) else None, _raw_seq(item),
        item_id if isinstance(item_id, str) else None, reason, payload,
        _digest(kind, reason, payload),
    ))
    return reason


def _conflict(
    state: _ApplyState, kind: str, item_id: str, origin: str | None, seq: int | None,
    reason: str, local: Any, remote: Any,
) -> None:
    local_json = None if local is None else _payload(local)
    remote_json = _payload(remote)
    state.conflicts.append((
        state.now, kind, origin, seq, item_id, reason, local_json, remote_json,
        _digest(kind, item_id, local_json or "", remote_json),
    ))


def _record_ledgers(conn: sqlite3.Connection, state: _ApplyState) -> None:
    """Conflicts and quarantine are deduplicated by digest; repeats bump a counter."""
    conn.executemany(
        "INSERT INTO logsync_conflicts (detected_at, kind, origin_replica, origin_seq, item_id, "
        "reason, local_json, remote_json, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(digest) DO UPDATE SET times_seen = times_seen + 1",
        state.conflicts,
    )
    conn.executemany(
        "INSERT INTO logsync_quarantine (received_at, kind, origin_replica, origin_seq, item_id, "
        "reason, payload_json, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(digest) DO UPDATE SET times_seen = times_seen + 1",
        state.quarantine,
    )


def _ledger_dict(row: sqlite3.Row, json_columns: tuple[str, ...]) -> dict[str, Any]:
    out = {k: row[k] for k in row.keys() if k != "digest"}
    for column in json_columns:
        out[column.removesuffix("_json")] = _json_or_raw(out.pop(column))
    return out


# ── argument checks ───────────────────────────────────────────────────


def _check_filter(column: str, value: Any) -> str:
    if column == "type":
        return model.event_type(value)
    if column == "status":
        return model.status(value) or ""
    return model.routing(column, value, required=True) or ""


def _check_since_created_at(value: Any) -> str:
    if isinstance(value, str) and len(value) == 10:
        try:
            datetime.strptime(value, "%Y-%m-%d")
            return value
        except ValueError:
            pass
    return model.created_at(value)


def _order_clause(order: Any) -> str:
    clauses = {"asc": "rowid ASC", "desc": "rowid DESC", "hlc": "hlc ASC, rowid ASC"}
    key = order.strip().lower() if isinstance(order, str) else order
    if key not in clauses:
        raise ValidationError(f"order={shorten(order)} is invalid: must be asc, desc or hlc")
    return clauses[key]


def _clamp_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValidationError(f"limit={shorten(limit)} is invalid: must be a positive integer")
    return min(limit, MAX_LIST_LIMIT)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
