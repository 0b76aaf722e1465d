"""The conflict and quarantine ledgers (tables `logsync_conflicts`, `logsync_quarantine`):
their rows, written inside the caller's transaction. A row is deduplicated by a digest
of what it says, so seeing the same conflict or bad op again bumps `times_seen`."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from logsync import model
from logsync.errors import shorten
from logsync.ids import is_replica_id

Row = tuple[Any, ...]


def payload(value: Any) -> str:
    """Verbatim JSON of what a peer sent; escaped where it holds lone surrogates. A value
    JSON cannot hold (nesting past the stack, an int past str(), mixed key types) is kept
    as the start of its repr, so recording a bad op never fails the page."""
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=repr)
    except (RecursionError, ValueError, TypeError):
        return json.dumps({"unencodable": shorten(value, 4096)})
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, sort_keys=True, default=repr)
    return text


def ledger_digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def raw_seq(op: Any) -> int | None:
    """The op's origin_seq if it is an integer SQLite can hold (bounded before any SQL)."""
    seq = op.get("origin_seq") if isinstance(op, Mapping) else None
    if isinstance(seq, int) and not isinstance(seq, bool) and 0 < seq <= model.MAX_SEQ:
        return seq
    return None


def quarantine_row(now: str, kind: str, item: Any, reason: str) -> Row:
    """One `logsync_quarantine` row: the item verbatim, with why it was refused."""
    text = payload(item)
    origin = item.get("origin_replica") if isinstance(item, Mapping) else None
    item_id = item.get("id") if isinstance(item, Mapping) else None
    return (
        now, kind, origin if is_replica_id(origin) else None, raw_seq(item),
        item_id if isinstance(item_id, str) and model.ID_RE.fullmatch(item_id) else None,
        reason, text, ledger_digest(kind, reason, text),
    )


def conflict_row(
    now: str, kind: str, item_id: str | None, origin: str | None, seq: int | None,
    reason: str, local: Any, remote: Any,
) -> Row:
    """One `logsync_conflicts` row: what we hold (`local`, None if nothing) and what came."""
    local_json = None if local is None else payload(local)
    remote_json = payload(remote)
    digest = ledger_digest(kind, item_id or "", local_json or "", remote_json)
    return (now, kind, origin, seq, item_id, reason, local_json, remote_json, digest)


def record_conflicts(conn: sqlite3.Connection, rows: Sequence[Row]) -> None:
    conn.executemany(
        "INSERT INTO logsync_conflicts (detected_at, kind, origin_replica, origin_seq, item_id, "
        "reason, local_json, remote_json, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(digest) DO UPDATE SET times_seen = times_seen + 1",
        rows,
    )


def record_quarantine(conn: sqlite3.Connection, rows: Sequence[Row]) -> None:
    conn.executemany(
        "INSERT INTO logsync_quarantine (received_at, kind, origin_replica, origin_seq, item_id, "
        "reason, payload_json, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(digest) DO UPDATE SET times_seen = times_seen + 1",
        rows,
    )
