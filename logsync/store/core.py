"""`Store`: one palace's logstream, a WAL SQLite file with many readers and one writer.

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

import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from logsync import hlc as hlc_mod
from logsync import model
from logsync.errors import (
    NotFoundError,
    ReplicaIdentityError,
    StoreError,
    ValidationError,
    shorten,
)
from logsync.replica import get_replica_id, read_replica_id
from logsync.store.apply import REFUSED_OWN_TOP_SQL, ApplyResult, apply_page, next_own_seq
from logsync.store.rows import artifact_dict, chunks, event_dict, ledger_dict
from logsync.store.schema import (
    FILTER_COLUMNS,
    HEALTH_UPSERT,
    INSERT_ARTIFACT,
    INSERT_EVENT,
    migrate,
    schema_problem,
)

DB_FILENAME = "logstream.sqlite3"
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 500
MAX_WAIT_TIMEOUT_MS = 300_000
BUSY_TIMEOUT_S = 10.0
MIN_FREE_BYTES = 64 * 1024  # below this a disk counts as full for health_problem()


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


IdFactory = Callable[[str], str]


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
        *,
        read_only: bool = False,
    ) -> None:
        self.palace = palace
        self.db_path = palace / DB_FILENAME
        self.replica_id = replica_id
        self.read_only = read_only
        self._wall_ms = wall_ms
        self._new_id = new_id
        self.clock = hlc_mod.HybridLogicalClock(replica_id, wall_ms)
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._conn_lock = threading.Lock()
        self._closed = False
        self._ro_uri = f"{self.db_path.resolve().as_uri()}?mode=ro"
        try:
            self._writer = self._connect()
            if read_only:
                problem = schema_problem(self._writer)
                if problem is not None:
                    raise StoreNeedsWrite(
                        f"{self.db_path} {problem}, which a read-only open cannot do: "
                        "open it once with write access (e.g. `logsync info` as its owner)"
                    )
            else:
                self._migrate()
            self._observe_stored_max()
        except BaseException:
            self.close()
            raise

    # ── opening and closing ───────────────────────────────────────────

    @classmethod
    def open(
        cls,
        palace: str | os.PathLike[str],
        *,
        wall_ms: Callable[[], int] | None = None,
        new_id: IdFactory | None = None,
        replica_id: str | None = None,
        read_only: bool = False,
        check: bool = True,
    ) -> Store:
        """Open (creating if needed) the store in a palace directory.

        ``read_only=True`` opens the file with ``mode=ro`` (falling back to
        ``immutable=1`` when SQLite cannot create its ``-shm`` beside a read-only file):
        no directory is made, nothing is chmod-ed, no migration runs; a store that needs
        one raises ``StoreNeedsWrite`` (a ``StoreError``) in one sentence. Only a palace
        directory created here is made 0700; an existing one keeps its mode.

        ``check=True`` runs ``PRAGMA quick_check(1)`` once at open and raises a
        ``StoreError`` that says how to recover when the file is corrupt. quick_check
        reads every page (it skips only the index-content cross-check of integrity_check):
        measured at 0.1 s for a 200 000-event store (173 MB, warm page cache) and about
        1 ms for a small one, so it runs on every open; ``check=False`` skips it for
        callers that reopen one store in a loop.
        """
        palace_path = Path(palace).expanduser()
        wall = wall_ms or hlc_mod.system_wall_ms
        if read_only:
            if not (palace_path / DB_FILENAME).is_file():
                raise StoreNeedsWrite(
                    f"there is no store at {palace_path / DB_FILENAME}: create it with "
                    f"`logsync --palace {palace_path} init`"
                )
            try:
                rid = replica_id or read_replica_id(palace_path)
            except ReplicaIdentityError as exc:
                raise StoreError(str(exc)) from None
            if rid is None:
                raise StoreNeedsWrite(
                    f"{palace_path} has no replica.json yet, which a read-only open cannot "
                    "write: open it once with write access (e.g. `logsync info` as its owner)"
                )
        else:
            if not palace_path.is_dir():
                try:
                    palace_path.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise StoreError(
                        f"cannot create palace directory {palace_path}: {exc.strerror or exc}"
                    ) from None
                with suppress(OSError):
                    palace_path.chmod(0o700)  # a directory we made; never an existing one
            rid = replica_id or get_replica_id(palace_path)
        try:
            store = cls(
                palace_path, rid, wall, new_id or default_id_factory(wall), read_only=read_only
            )
        except sqlite3.Error as exc:
            raise StoreError(describe_fault(palace_path / DB_FILENAME, "open", exc)) from None
        if check:
            try:
                problem = store.corruption()
            except BaseException:
                store.close()
                raise
            if problem is not None:
                store.close()
                raise StoreError(problem)
        return store

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
        if self.read_only:
            conn = self._connect_read_only()
        else:
            conn = sqlite3.connect(
                self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                check_same_thread=False,
            )
            conn.row_factory = sqlite3.Row
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
            except BaseException:
                conn.close()
                raise
        with self._conn_lock:
            if self._closed:
                conn.close()
                raise StoreError(f"store {self.db_path} is closed")
            self._connections.append(conn)
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        """``mode=ro``; ``immutable=1`` when SQLite cannot create the WAL index beside it."""
        last: sqlite3.Error | None = None
        for uri in (self._ro_uri, self._ro_uri + "&immutable=1"):
            conn = sqlite3.connect(
                uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                check_same_thread=False,
            )
            conn.row_factory = sqlite3.Row
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError as exc:
                conn.close()
                last = exc
                continue
            return conn
        assert last is not None
        raise last

    def _reader(self) -> sqlite3.Connection:
        """One read connection per thread: WAL readers never block the writer."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    @contextmanager
    def _atomic(self, *, durable: bool) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE serialises writers across processes.

        Every SQLite failure but a constraint violation becomes a ``StoreError`` naming
        the file and the cause (disk full, read-only, corrupt, locked). SQLite may have
        rolled the transaction back itself (a full disk does), so ROLLBACK runs only
        while a transaction is still open.
        """
        if self.read_only:
            raise StoreError(f"cannot write to {self.db_path}: the store was opened read-only")
        with self._write_lock:
            conn = self._writer
            try:
                conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise StoreError(describe_fault(self.db_path, "write to", exc)) from None
            try:
                yield conn
            except sqlite3.IntegrityError:
                self._rollback(conn)
                raise
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise StoreError(describe_fault(self.db_path, "write to", exc)) from None
            except BaseException:
                self._rollback(conn)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise StoreError(describe_fault(self.db_path, "commit to", exc)) from None

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            with suppress(sqlite3.Error):  # the original failure is the one to report
                conn.execute("ROLLBACK")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self._reader().execute(sql, params).fetchall()
        except OverflowError:
            raise ValidationError(
                "a number in the request is too large: SQLite integers stop at 2**63 - 1"
            ) from None
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            raise StoreError(describe_fault(self.db_path, "read", exc)) from None

    # ── health ────────────────────────────────────────────────────────

    def corruption(self) -> str | None:
        """``PRAGMA quick_check(1)``: None when the file is sound, else the recovery line."""
        try:
            rows = self._reader().execute("PRAGMA quick_check(1)").fetchall()
        except sqlite3.Error as exc:
            if _primary(exc) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
                return corrupt_sentence(self.db_path, str(exc))
            raise StoreError(describe_fault(self.db_path, "check", exc)) from None
        verdict = str(rows[0][0]) if rows else "no answer"
        if verdict == "ok":
            return None
        detail = " ".join(verdict.replace("*** in database main ***", "").split())
        return corrupt_sentence(self.db_path, detail[:120])

    def health_problem(self) -> str | None:
        """A cheap check for a faulted store: one small durable write, free space, and
        ``quick_check(1)``. One sentence naming the problem, or None when healthy."""
        if self.read_only:
            return f"the store {self.db_path} is open read-only"
        try:
            with self._atomic(durable=True) as conn:
                conn.execute(HEALTH_UPSERT, (datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),))
        except StoreError as exc:
            return str(exc)
        try:
            stat = os.statvfs(self.palace)
        except OSError:
            pass
        else:
            free = stat.f_bavail * stat.f_frsize
            if free < MIN_FREE_BYTES:
                return (
                    f"cannot write to {self.db_path}: the disk is full ({free} bytes free, "
                    f"at least {MIN_FREE_BYTES} needed): free some space"
                )
        try:
            return self.corruption()
        except StoreError as exc:
            return str(exc)

    # ── migrations (named, ordered, each idempotent) ──────────────────

    def _migrate(self) -> None:
        with self._atomic(durable=True) as conn:
            migrate(conn, self.replica_id)

    def _observe_stored_max(self) -> None:
        """Seed the clock from what is stored, so a restart never ticks backwards."""
        self._catch_up_clock(self._writer)

    def _catch_up_clock(self, conn: sqlite3.Connection) -> int:
        """Absorb the newest stamp within the drift bound and, unconditionally, our own
        newest (ours even if the wall clock has since gone back); return our last seq."""
        ceiling = hlc_mod.drift_ceiling(self._wall_ms())
        top = conn.execute("SELECT max(hlc) FROM events WHERE hlc < ?", (ceiling,)).fetchone()[0]
        if top:
            self.clock.observe(top)
        own = conn.execute(
            "SELECT origin_seq, hlc FROM events WHERE origin_replica = ? "
            "ORDER BY origin_seq DESC LIMIT 1",
            (self.replica_id,),
        ).fetchone()
        if own is None:
            return 0
        self.clock.absorb_own(own["hlc"])
        return int(own["origin_seq"])

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
                    "type": type,
                    "stream": stream,
                    "room": room,
                    "from_agent": from_agent,
                    "to_agent": to_agent,
                    "correlation_id": correlation_id,
                    "branch": branch,
                    "base_commit": base_commit,
                    "status": status,
                    "body": body,
                    "metadata": metadata,
                    "artifact_ids": artifact_ids,
                    "topic": topic,
                }
            )
        )
        with self._atomic(durable=True) as conn:
            for artifact_id in fields["artifact_ids"]:
                if not conn.execute(
                    "SELECT 1 FROM artifacts WHERE id = ?", (artifact_id,)
                ).fetchone():
                    raise ValidationError(
                        f"artifact_ids names {artifact_id!r}, which is not stored here: "
                        "put the artifact first"
                    )
            event_id = self._insert_local_event(conn, fields)
        return self._event_by_id(event_id)

    def _insert_local_event(self, conn: sqlite3.Connection, fields: dict[str, Any]) -> str:
        seq = next_own_seq(conn, self.replica_id, self._catch_up_clock(conn))
        event_id = self._new_id("evt")
        row = (
            event_id,
            fields["type"],
            fields["stream"],
            fields["room"],
            fields["topic"],
            fields["from_agent"],
            fields["to_agent"],
            fields["correlation_id"],
            fields["branch"],
            fields["base_commit"],
            fields["status"],
            fields["body"],
            model.utc_now_iso(self._wall_ms()),
            fields["metadata_json"],
            self.replica_id,
            seq,
            self.clock.tick(),
        )
        try:
            conn.execute(INSERT_EVENT, row)
        except sqlite3.IntegrityError:
            raise StoreError(
                f"event id {event_id!r} already exists; the id factory repeated"
            ) from None
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
            "created_by",
            created_by.strip() if isinstance(created_by, str) else created_by,
            required=True,
        )
        meta = model.metadata_json(metadata)
        raw_len = len(content.encode("utf-8"))
        record = {
            "id": self._new_id("art"),
            "kind": kind,
            "sha256": model.sha256_hex(content),
            "size_bytes": raw_len,
            "created_by": created_by_clean,
            "created_at": model.utc_now_iso(self._wall_ms()),
            "origin_replica": self.replica_id,
        }
        with self._atomic(durable=True) as conn:
            conn.execute(
                INSERT_ARTIFACT,
                (
                    record["id"],
                    kind,
                    record["sha256"],
                    raw_len,
                    content,
                    created_by_clean,
                    record["created_at"],
                    meta,
                    self.replica_id,
                ),
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
            model.ACK_EVENT_TYPE,
            target["stream"],
            target["room"],
            from_agent,
            to_agent=target["from_agent"],
            correlation_id=target["correlation_id"] or target["id"],
            status=status,
            body=body,
            metadata={"ack_of": target["id"]},
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
                {
                    "type": "patch.ready",
                    "stream": stream,
                    "room": room,
                    "from_agent": from_agent,
                    "to_agent": to_agent,
                    "correlation_id": correlation_id,
                    "branch": branch,
                    "base_commit": base_commit,
                    "body": body,
                    "metadata": metadata,
                    "topic": topic,
                }
            )
        )
        artifact = self.put_artifact("patch", content, from_agent, metadata)
        event = self.append_event(
            "patch.ready",
            stream,
            room,
            from_agent,
            to_agent=to_agent,
            correlation_id=correlation_id,
            branch=branch,
            base_commit=base_commit,
            status="ready",
            body=body,
            metadata=metadata,
            artifact_ids=[artifact["id"]],
            topic=topic,
        )
        return {"artifact": artifact, "event": event}

    # ── reads ─────────────────────────────────────────────────────────

    def get_artifact(self, artifact_id: str) -> dict[str, Any] | None:
        """One artifact with its exact content, or None."""
        rows = self._read("SELECT * FROM artifacts WHERE id = ?", (artifact_id,))
        return artifact_dict(rows[0]) if rows else None

    def get_artifacts(self, ids: Iterable[str]) -> list[dict[str, Any]]:
        """Several artifacts at once (unknown ids are left out), ordered by id."""
        wanted = sorted(set(ids))
        out: list[dict[str, Any]] = []
        for chunk in chunks(wanted, 500):
            marks = ",".join("?" * len(chunk))
            rows = self._read(f"SELECT * FROM artifacts WHERE id IN ({marks}) ORDER BY id", chunk)
            out.extend(artifact_dict(r) for r in rows)
        return out

    def missing_artifacts(self, ids: Iterable[str]) -> list[str]:
        """Which of these artifact ids this replica does not hold (sorted)."""
        wanted = sorted(set(ids))
        have: set[str] = set()
        for chunk in chunks(wanted, 500):
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
            stream=stream,
            room=room,
            topic=topic,
            type=type,
            to_agent=to_agent,
            from_agent=from_agent,
            correlation_id=correlation_id,
            status=status,
            since_created_at=since_created_at,
        )
        for name, value, op in (
            ("since_event_id", since_event_id, ">"),
            ("before_event_id", before_event_id, "<"),
        ):
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
        for column in FILTER_COLUMNS:
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
        if (
            isinstance(timeout_ms, bool)
            or not isinstance(timeout_ms, int | float)
            or timeout_ms < 0
        ):
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

    def own_seen_top(self) -> int:
        """The highest origin_seq of our own origin we hold or have seen refused."""
        held = self._read("SELECT coalesce(max(origin_seq), 0) FROM events "
                          "WHERE origin_replica = ?", (self.replica_id,))
        refused = self._read(REFUSED_OWN_TOP_SQL, (self.replica_id,))
        return max(int(held[0][0]), int(refused[0][0]))

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
            raise ValidationError(
                f"after={shorten(after)} is invalid: must be a non-negative integer"
            )
        if after >= 2**63:
            raise ValidationError(f"after={shorten(after)} is invalid: must be below 2**63")
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
            yield from (artifact_dict(r) for r in rows)
            last = rows[-1]["id"]

    def counts(self) -> dict[str, int]:
        tables = (
            ("events", "events"),
            ("artifacts", "artifacts"),
            ("conflicts", "logsync_conflicts"),
            ("quarantined", "logsync_quarantine"),
        )
        return {
            name: int(self._read(f"SELECT count(*) FROM {table}")[0][0]) for name, table in tables
        }

    def list_conflicts(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._read(
            "SELECT * FROM logsync_conflicts ORDER BY id DESC LIMIT ?", (_clamp_limit(limit),)
        )
        return [ledger_dict(r, ("local_json", "remote_json")) for r in rows]

    def list_quarantine(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._read(
            "SELECT * FROM logsync_quarantine ORDER BY id DESC LIMIT ?", (_clamp_limit(limit),)
        )
        return [ledger_dict(r, ("payload_json",)) for r in rows]

    def _attach(self, rows: Sequence[sqlite3.Row]) -> list[dict[str, Any]]:
        """Event dicts in upstream key order, artifact_ids sorted."""
        events = [event_dict(r) for r in rows]
        if not events:
            return events
        by_id = {e["id"]: e for e in events}
        for chunk in chunks(list(by_id), 500):
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

    def apply_remote(self, events: Sequence[Any], artifacts: Sequence[Any] = ()) -> ApplyResult:
        """Fold a page of remote ops (and the artifacts they name) in, in one transaction."""
        with self._atomic(durable=False) as conn:
            result, max_hlc = apply_page(conn, self.replica_id, events, artifacts, self._wall_ms())
        if max_hlc:
            self.clock.observe(max_hlc)
        return result


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
