"""Reads of a `Store` (a mixin): events, artifacts, cursors, vectors, ledgers.

`seq` (the rowid) is local arrival order, the delivery cursor; `hlc` is the
fleet-wide merge order. Cursors never use HLC.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from logsync import model
from logsync.errors import (
    NotFoundError,
    StoreError,
    ValidationError,
    shorten,
)
from logsync.store.apply import REFUSED_OWN_TOP_SQL
from logsync.store.audit import AuditReport, audit_store
from logsync.store.chaining import VECTOR_SQL
from logsync.store.faults import describe_fault
from logsync.store.ledgers import LedgerTops, check_origin, conflict_filter
from logsync.store.rows import artifact_dict, chunks, event_dicts, ledger_dict
from logsync.store.schema import FILTER_COLUMNS, REVIEWED_COLUMN

DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 500
MAX_WAIT_TIMEOUT_MS = 300_000  # the longest wait of `waiting.wait_events`


class Reads:
    """Methods `Store` inherits; they use its `_read` and `_reader`."""

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
            raise NotFoundError(f"event {shorten(event_id)} not found")
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
            raise NotFoundError(f"{name} {shorten(event_id)} not found in this replica")
        return int(rows[0][0])

    def latest_event_id(self) -> str | None:
        rows = self._read("SELECT id FROM events ORDER BY rowid DESC LIMIT 1")
        return rows[0]["id"] if rows else None

    def events_after_seq(self, seq: int, limit: int = MAX_LIST_LIMIT) -> list[dict[str, Any]]:
        """Events with a local seq above `seq`, in arrival order (stream tailing)."""
        rows = self._read(
            "SELECT rowid, * FROM events WHERE rowid > ? ORDER BY rowid LIMIT ?", (seq, limit)
        )
        return self._attach(rows)

    def chain_digest(self, origin: str, seq: int) -> bytes | None:
        """The chain digest (32 bytes) of the op `(origin, seq)`, or None if not held."""
        rows = self._read(
            "SELECT digest FROM logsync_chain WHERE origin = ? AND origin_seq = ?", (origin, seq)
        )
        return bytes(rows[0][0]) if rows else None

    def chain_tip(self, origin: str) -> tuple[int, bytes] | None:
        """`(origin_seq, digest)` of the highest op of `origin` in the chain, or None."""
        rows = self._read(
            "SELECT origin_seq, digest FROM logsync_chain WHERE origin = ? "
            "ORDER BY origin_seq DESC LIMIT 1",
            (origin,),
        )
        return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

    def chain_signature(self, origin: str, seq: int) -> bytes | None:
        """The origin's signature (64 bytes) over the op's chain digest, or None (unsigned
        or not held)."""
        rows = self._read(
            "SELECT signature FROM logsync_chain WHERE origin = ? AND origin_seq = ?",
            (origin, seq),
        )
        return bytes(rows[0][0]) if rows and rows[0][0] is not None else None

    def public_keys(self) -> dict[str, bytes]:
        """Every origin's known public key (ours and those pinned), by origin."""
        rows = self._read("SELECT origin, public_key FROM logsync_keys ORDER BY origin")
        return {str(r[0]): bytes(r[1]) for r in rows}

    def origin_key(self, origin: str) -> bytes | None:
        """The public key known for one origin (a page's: not every origin's)."""
        rows = self._read("SELECT public_key FROM logsync_keys WHERE origin = ?", (origin,))
        return bytes(rows[0][0]) if rows else None

    def audit(self, origin: str | None = None) -> AuditReport:
        """Every chain entry and artifact re-checked against a recomputation from the ops
        and contents (`logsync verify`), in one snapshot on this thread's read connection;
        only `origin`'s chain when given (artifacts always all). Repairs nothing."""
        try:
            return audit_store(self._reader(), origin)
        except sqlite3.Error as exc:
            raise StoreError(describe_fault(self.db_path, "read", exc)) from None

    def own_seen_top(self) -> int:
        """The highest origin_seq of our own origin we hold or have seen refused."""
        held = self._read("SELECT coalesce(max(origin_seq), 0) FROM events "
                          "WHERE origin_replica = ?", (self.replica_id,))
        refused = self._read(REFUSED_OWN_TOP_SQL, (self.replica_id,))
        return max(int(held[0][0]), int(refused[0][0]))

    def origin_top(self, origin: str) -> int:
        """One origin's entry of the version vector (one index seek, not the walk)."""
        rows = self._read("SELECT coalesce(max(origin_seq), 0) FROM events "
                          "WHERE origin_replica = ?", (origin,))
        return int(rows[0][0])

    def version_vector(self) -> dict[str, int]:
        rows = self._read(VECTOR_SQL)
        return {r["origin_replica"]: int(r["top"]) for r in rows if r["top"] is not None}

    def list_ops(
        self, origin: str, after: int = 0, limit: int = 500, *, max_limit: int = 500
    ) -> list[dict[str, Any]]:
        """Ops authored by `origin` with origin_seq > after, in author order."""
        origin, count = _ops_range(origin, after, limit, max_limit)
        rows = self._read(
            "SELECT rowid, * FROM events WHERE origin_replica = ? AND origin_seq > ? "
            "ORDER BY origin_seq LIMIT ?",
            (origin, after, count),
        )
        return self._attach(rows)

    def op_keys(
        self, origin: str, after: int = 0, limit: int = 500, *, max_limit: int = 500
    ) -> list[tuple[int, int]]:
        """`(origin_seq, seq)` of the ops `list_ops` returns for the same arguments, read
        from the index alone (the server's `OpCache` holds the ops' bytes)."""
        origin, count = _ops_range(origin, after, limit, max_limit)
        rows = self._read(
            "SELECT origin_seq, rowid FROM events WHERE origin_replica = ? "
            "AND origin_seq > ? ORDER BY origin_seq LIMIT ?",
            (origin, after, count),
        )
        return [(r[0], r[1]) for r in rows]

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

    def counts(self, *, unreviewed: bool = False) -> dict[str, int]:
        """Rows per table. ``unreviewed=True`` adds ``conflicts_unreviewed``, the conflicts
        `logsync conflicts review` has not marked (an opt-in key: callers compare the
        plain dict whole)."""
        tables = (
            ("events", "events"),
            ("artifacts", "artifacts"),
            ("conflicts", "logsync_conflicts"),
            ("quarantined", "logsync_quarantine"),
        )
        out = {
            name: int(self._read(f"SELECT count(*) FROM {table}")[0][0]) for name, table in tables
        }
        if unreviewed:
            where, params = conflict_filter(None, None, True,
                                            has_reviewed=self._has_reviewed_column())
            out["conflicts_unreviewed"] = int(
                self._read(f"SELECT count(*) FROM logsync_conflicts{where}", params)[0][0])
        return out

    def ledger_tops(self) -> LedgerTops:
        """The newest row of the conflict and quarantine ledgers, as (id, time, digest): a
        row recorded again only bumps its `times_seen`, so these move only when something
        new is recorded. The id alone would not do: `quarantine retry` deletes rows, and
        SQLite gives the next row the id of a deleted newest one."""
        return (self._newest("logsync_conflicts", "detected_at"),
                self._newest("logsync_quarantine", "received_at"))

    def _newest(self, table: str, stamp: str) -> tuple[int, str, str]:
        rows = self._read(f"SELECT id, {stamp}, digest FROM {table} ORDER BY id DESC LIMIT 1")
        return (int(rows[0][0]), str(rows[0][1]), str(rows[0][2])) if rows else (0, "", "")

    def list_conflicts(
        self, limit: int = 100, *, origin: str | None = None, kind: str | None = None,
        unreviewed: bool = False,
    ) -> list[dict[str, Any]]:
        """Newest first, optionally only one origin's, one kind (`ledgers.CONFLICT_KINDS`)
        or the unreviewed ones; each row has ``reviewed_at`` (None: not reviewed)."""
        has_reviewed = self._has_reviewed_column()
        where, params = conflict_filter(origin, kind, unreviewed, has_reviewed=has_reviewed)
        rows = self._read(f"SELECT * FROM logsync_conflicts{where} ORDER BY id DESC LIMIT ?",
                          (*params, _clamp_limit(limit)))
        out = [ledger_dict(r, ("local_json", "remote_json")) for r in rows]
        if not has_reviewed:
            for row in out:
                row["reviewed_at"] = None
        return out

    def list_quarantine(self, limit: int = 100, *, origin: str | None = None
                        ) -> list[dict[str, Any]]:
        """Newest first, optionally only the ops held of one origin."""
        where, params = "", []
        if origin is not None:
            where, params = " WHERE origin_replica = ?", [check_origin(origin)]
        rows = self._read(f"SELECT * FROM logsync_quarantine{where} ORDER BY id DESC LIMIT ?",
                          (*params, _clamp_limit(limit)))
        return [ledger_dict(r, ("payload_json",)) for r in rows]

    def _has_reviewed_column(self) -> bool:
        """Whether the conflicts ledger has `reviewed_at` (a read-only open of an older
        store reads it without migrating)."""
        return any(r[1] == REVIEWED_COLUMN
                   for r in self._read("PRAGMA table_info(logsync_conflicts)"))

    def _attach(self, rows: Sequence[sqlite3.Row]) -> list[dict[str, Any]]:
        """Event dicts in upstream key order, artifact_ids sorted."""
        events = event_dicts(rows)
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


def _ops_range(origin: Any, after: Any, limit: Any, max_limit: int) -> tuple[str, int]:
    """The checked origin and row count of a `list_ops`/`op_keys` read."""
    origin = model.routing("origin", origin, required=True) or ""
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValidationError(
            f"after={shorten(after)} is invalid: must be a non-negative integer"
        )
    if after >= 2**63:
        raise ValidationError(f"after={shorten(after)} is invalid: must be below 2**63")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValidationError(f"limit={shorten(limit)} is invalid: must be a positive integer")
    return origin, min(limit, max_limit)


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
    """A listing's row count, at most `MAX_LIST_LIMIT`: the API's bound on one read. What
    an operator types never reaches it unchecked: the CLI's `--limit` and the status
    page's `limit` refuse a larger number in one sentence (`cli/_common.py`)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValidationError(f"limit={shorten(limit)} is invalid: must be a positive integer")
    return min(limit, MAX_LIST_LIMIT)
