"""The conflict and quarantine ledgers (tables `logsync_conflicts`, `logsync_quarantine`):
their rows, written inside the caller's transaction. A row is deduplicated by a digest
of what it says, so seeing the same conflict or bad op again bumps `times_seen`.

Also the operator's side of the conflicts ledger: the filters `logsync conflicts` takes
(an origin, a kind of `CONFLICT_KINDS`, unreviewed only) and marking rows reviewed (a
conflict seen again keeps its mark: the same digest is the same finding)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from logsync import model
from logsync.errors import NotFoundError, ValidationError, shorten
from logsync.ids import is_replica_id

Row = tuple[Any, ...]
# The newest row (id, recorded at, digest) of the conflicts and of the quarantine ledger
LedgerTops = tuple[tuple[int, str, str], tuple[int, str, str]]

# Every kind of conflict row logsync writes: the apply checks (`apply.APPLY_CHECKS` and
# the artifact check) and the chain's records (`chainreads`: divergence, key_change).
CONFLICT_KINDS = (
    "artifact", "divergence", "forged_origin", "fork", "history_rewrite", "id_collision",
    "key_change", "restored_replica",
)


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
    if not rows:  # nearly every page: skip the statement (a few us each, per page)
        return
    conn.executemany(
        "INSERT INTO logsync_conflicts (detected_at, kind, origin_replica, origin_seq, item_id, "
        "reason, local_json, remote_json, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(digest) DO UPDATE SET times_seen = times_seen + 1",
        rows,
    )


def record_quarantine(conn: sqlite3.Connection, rows: Sequence[Row]) -> None:
    if not rows:
        return
    conn.executemany(
        "INSERT INTO logsync_quarantine (received_at, kind, origin_replica, origin_seq, item_id, "
        "reason, payload_json, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(digest) DO UPDATE SET times_seen = times_seen + 1",
        rows,
    )


# ── the operator's filters and marks ─────────────────────────────────


def check_origin(origin: Any, name: str = "origin") -> str:
    """A replica id to filter by, or one `ValidationError` sentence naming the value."""
    if not is_replica_id(origin):
        raise ValidationError(
            f"{name} {shorten(origin)} is not a replica id: it must be rep_ followed by 12 "
            "or 32 lowercase hex digits"
        )
    return str(origin)


def check_kind(kind: Any, name: str = "kind") -> str:
    """One of `CONFLICT_KINDS`, or one sentence naming the value and the allowed ones."""
    if kind not in CONFLICT_KINDS:
        raise ValidationError(
            f"{name} {shorten(kind)} is not a conflict kind: it must be one of "
            f"{', '.join(CONFLICT_KINDS)}"
        )
    return str(kind)


def conflict_filter(
    origin: str | None, kind: str | None, unreviewed: bool, *, has_reviewed: bool = True
) -> tuple[str, list[Any]]:
    """A WHERE clause (empty or starting with ' WHERE') over `logsync_conflicts` and its
    parameters; values checked first. Without the ``reviewed_at`` column (an older store
    read without migrating), every row is unreviewed."""
    where: list[str] = []
    params: list[Any] = []
    if origin is not None:
        where.append("origin_replica = ?")
        params.append(check_origin(origin))
    if kind is not None:
        where.append("kind = ?")
        params.append(check_kind(kind))
    if unreviewed and has_reviewed:
        where.append("reviewed_at IS NULL")
    return (" WHERE " + " AND ".join(where) if where else ""), params


def review_conflicts(
    conn: sqlite3.Connection, now: str, ids: Sequence[int] | None, *,
    origin: str | None = None, kind: str | None = None,
) -> dict[str, Any]:
    """Mark conflicts reviewed at `now`: the rows `ids` (every one must exist, else
    nothing is marked), or with ``ids=None`` every row the filters select. A row already
    reviewed keeps its first mark. Returns ``{"reviewed": n, "already_reviewed": m}``
    (and ``"ids"`` for explicit ids)."""
    if ids is None:
        where, params = conflict_filter(origin, kind, False)
        where += " AND" if where else " WHERE"
        already = conn.execute(f"SELECT count(*) FROM logsync_conflicts{where} reviewed_at "
                               "IS NOT NULL", params).fetchone()[0]
        done = conn.execute(f"UPDATE logsync_conflicts SET reviewed_at = ?{where} reviewed_at "
                            "IS NULL", (now, *params)).rowcount
        return {"reviewed": done, "already_reviewed": int(already)}
    wanted = sorted(set(ids))
    found: dict[int, str | None] = {}
    for start in range(0, len(wanted), 500):
        chunk = wanted[start:start + 500]
        rows = conn.execute(
            f"SELECT id, reviewed_at FROM logsync_conflicts WHERE id IN "
            f"({','.join('?' * len(chunk))})", chunk).fetchall()
        found.update((int(r[0]), r[1]) for r in rows)
    missing = [i for i in wanted if i not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise NotFoundError(
            f"conflict {missing[0]}{more} does not exist: `logsync conflicts` lists the ids; "
            "nothing was marked"
        )
    fresh = [i for i in wanted if found[i] is None]
    conn.executemany("UPDATE logsync_conflicts SET reviewed_at = ? WHERE id = ?",
                     [(now, i) for i in fresh])
    return {"reviewed": len(fresh), "already_reviewed": len(wanted) - len(fresh),
            "ids": wanted}
