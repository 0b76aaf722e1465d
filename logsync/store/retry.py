"""`logsync quarantine retry`: held ops judged again by the rules that refused them.

A quarantined op waits for its cause to go away (its artifact arrives by another path, a
validator is fixed); the next pull applies it then, but only from a peer that still serves
it. Retry re-judges what the quarantine holds, with the apply path itself
(`apply.apply_page`, as `Store.apply_remote` calls it), one op at a time inside a
savepoint of one transaction, and keeps its rules:

- **Order.** Each origin's rows are taken in origin_seq order. An op is offered to apply
  only when it is the next of its origin: ``origin_seq == top + 1``, `top` the highest
  held. One further on waits (``waits_for``), because applying it would leave a gap and
  the per-origin prefix is an invariant. An origin with gaps of its own (a MemPalace hub
  counts rowids, RFC 004 §6.2) may have its next op further on: retry leaves that one
  held, and the next pull applies it once its cause is gone.
- **At or below the top** the op is offered too: the apply rules then find it already held
  (it leaves the quarantine) or record the conflict it is (`fork`, `history_rewrite`...;
  the conflict row keeps the op verbatim, so it leaves the quarantine as well).
- **Proofs.** An op a signed page refused (`bad_signature`, `chain_mismatch`, or a
  `missing_artifact` found while checking the page) was never proven by its author's key,
  and retry cannot check a signature: it leaves only when the same op is already held,
  never by being applied (a pull from a logsync peer proves and applies it).
- **Still held** rows keep their row; a changed reason is written (and its digest, merged
  into a row that already says the same). Nothing else about them changes, so a second
  retry changes nothing. Applied, already-held and conflict rows are deleted: the op is in
  `events` or in the conflicts ledger, and `quarantined` counts what is still held.

A row's content is whatever a peer sent (or another program wrote): at most
`MAX_ROWS` rows per call, a payload over `MAX_PAYLOAD_CHARS` is not read, one that is not
a JSON object of the row's own origin and seq stays held with a reason; nothing here
raises for content.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from logsync import model, remoteops
from logsync.errors import ValidationError, shorten
from logsync.ids import is_replica_id
from logsync.pagechain import BAD_SIGNATURE, CHAIN_MISMATCH, MISSING_ARTIFACT
from logsync.store.apply import apply_page
from logsync.store.ledgers import ledger_digest, raw_seq

MAX_ROWS = 10_000  # rows one retry looks at, oldest first; the report says when more wait
MAX_PAYLOAD_CHARS = 4 * 1024 * 1024  # above any valid op (body 256 KiB, metadata 64 KiB)
PROOF_REASONS = tuple(f"{r}: " for r in (BAD_SIGNATURE, CHAIN_MISMATCH, MISSING_ARTIFACT))
APPLIED, ALREADY_HELD, CONFLICT, HELD = "applied", "already_held", "conflict", "held"


@dataclass
class HeldOp:
    """A row that stays in the quarantine, and why."""

    row_id: int
    kind: str
    origin_seq: int | None
    reason: str
    waits_for: int | None = None  # the origin_seq that must be held first

    def to_json(self) -> dict[str, Any]:
        return {"id": self.row_id, "kind": self.kind, "origin_seq": self.origin_seq,
                "reason": self.reason, "waits_for": self.waits_for}


@dataclass
class OriginRetry:
    """What retry did for one origin's rows (origin None: rows without a usable one)."""

    origin: str | None
    retried: int = 0
    applied: int = 0
    already_held: int = 0
    conflicts: int = 0
    held: list[HeldOp] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"origin": self.origin, "retried": self.retried, "applied": self.applied,
                "already_held": self.already_held, "conflicts": self.conflicts,
                "still_held": len(self.held), "held": [h.to_json() for h in self.held]}


@dataclass
class RetryReport:
    """Per origin, in order (artifact rows under their artifact's origin)."""

    origins: list[OriginRetry] = field(default_factory=list)
    truncated: bool = False  # more rows than MAX_ROWS: a later retry looks at the rest

    def total(self, name: str) -> int:
        if name == "still_held":
            return sum(len(o.held) for o in self.origins)
        return sum(int(getattr(o, name)) for o in self.origins)

    def to_json(self) -> dict[str, Any]:
        names = ("retried", "applied", "already_held", "conflicts", "still_held")
        return {"origins": [o.to_json() for o in self.origins], "truncated": self.truncated,
                "totals": {n: self.total(n) for n in names}}


@dataclass(frozen=True)
class _Row:
    row_id: int
    kind: str
    origin: str | None
    seq: int | None
    reason: str
    size: int


def retry_quarantine(
    conn: sqlite3.Connection, replica_id: str, now_ms: int, *, own_verified: bool,
    origin: str | None = None,
) -> RetryReport:
    """Re-judge the held rows (only `origin`'s when given) inside the caller's transaction.
    `own_verified` as `apply_page` takes it (`Store.apply_remote` passes the same)."""
    rows = _scan(conn, origin)
    report = RetryReport(truncated=len(rows) > MAX_ROWS)
    rows = rows[:MAX_ROWS]
    judge = _Judge(conn, replica_id, now_ms, own_verified)
    groups: dict[str | None, OriginRetry] = {}

    def entry(key: str | None) -> OriginRetry:
        if key not in groups:
            groups[key] = OriginRetry(key)
            report.origins.append(groups[key])
        return groups[key]

    # artifacts first, as a page applies them: an op held for one may then apply
    for row in (r for r in rows if r.kind == "artifact"):
        judge.artifact(row, entry(row.origin))
    by_origin: dict[str | None, list[_Row]] = {}
    for row in rows:
        if row.kind != "artifact":
            by_origin.setdefault(row.origin, []).append(row)
    for key in sorted(by_origin, key=lambda o: (o is None, o or "")):
        mine = sorted(by_origin[key], key=lambda r: (r.seq is None, r.seq or 0, r.row_id))
        judge.origin(key, mine, entry(key))
    return report


def _scan(conn: sqlite3.Connection, origin: str | None) -> list[_Row]:
    """Up to MAX_ROWS + 1 rows without their payloads (bounded whatever they hold)."""
    sql = ("SELECT id, kind, origin_replica, origin_seq, reason, length(payload_json) "
           "FROM logsync_quarantine")
    params: tuple[Any, ...] = ()
    if origin is not None:
        sql, params = sql + " WHERE origin_replica = ?", (origin,)
    out = []
    for r in conn.execute(sql + " ORDER BY id LIMIT ?", (*params, MAX_ROWS + 1)):
        seq = r[3] if isinstance(r[3], int) and 0 < r[3] <= model.MAX_SEQ else None
        out.append(_Row(int(r[0]), str(r[1]), r[2] if is_replica_id(r[2]) else None, seq,
                        r[4] if isinstance(r[4], str) else "", int(r[5] or 0)))
    return out


class _Judge:
    """One retry's decisions over one connection inside one transaction."""

    def __init__(self, conn: sqlite3.Connection, replica_id: str, now_ms: int,
                 own_verified: bool) -> None:
        self.conn = conn
        self.replica_id = replica_id
        self.now_ms = now_ms
        self.own_verified = own_verified

    def origin(self, origin: str | None, rows: list[_Row], out: OriginRetry) -> None:
        """One origin's event rows, in origin_seq order (see the module docstring)."""
        top = self._top(origin) if origin is not None else 0
        for row in rows:
            out.retried += 1
            op, problem = self._payload(row)
            if problem is not None:
                self._hold(row, out, problem)
                continue
            if origin is not None and row.seq is not None and row.seq > top + 1:
                self._hold(row, out, row.reason, waits_for=top + 1)
                continue
            unproven = row.reason.startswith(PROOF_REASONS)
            if unproven and (row.seq is None or row.seq > top):
                self._hold(row, out, row.reason)  # only a page that proves it applies it
                continue
            outcome, reason = self._offer(op, [op], [], origin, only_held=unproven)
            self._settle(row, out, outcome, reason)
            if outcome == APPLIED and origin is not None:
                top = self._top(origin)

    def artifact(self, row: _Row, out: OriginRetry) -> None:
        out.retried += 1
        art, problem = self._payload(row, check_event=False)
        if problem is not None:
            self._hold(row, out, problem)
            return
        outcome, reason = self._offer(art, [], [art], None)
        self._settle(row, out, outcome, reason)

    # ── one offer ────────────────────────────────────────────────────

    def _offer(self, item: Any, events: list[Any], artifacts: list[Any],
               origin: str | None, *, only_held: bool = False) -> tuple[str, str]:
        """Validate `item` as apply does, then apply it inside a savepoint: kept when it
        was applied, found held, or recorded as a conflict; rolled back when it would be
        held again (its row is not counted twice), and with `only_held` unless it was
        found held (an unproven op is never applied, nor turned into a conflict)."""
        try:
            if events:
                remoteops.validate_remote_event(item)
            else:
                model.validate_remote_artifact(item)
        except ValidationError as exc:
            return HELD, str(exc)
        conn = self.conn
        conn.execute("SAVEPOINT retry_one")
        try:
            result = apply_page(conn, self.replica_id, events, artifacts, self.now_ms,
                                own_verified=self.own_verified)
        except sqlite3.IntegrityError as exc:
            outcome, reason = HELD, f"the store refused it ({exc})"
        else:
            outcome, reason = _outcome(result.applied + result.artifacts_applied,
                                       result.quarantined, result.conflicts)
            if outcome == HELD and origin is not None:
                reason = result.stopped.get(origin, "")
        if only_held and outcome != ALREADY_HELD:
            outcome, reason = HELD, ""
        if outcome == HELD:
            conn.execute("ROLLBACK TO retry_one")
        conn.execute("RELEASE retry_one")
        return outcome, reason

    # ── the rows ─────────────────────────────────────────────────────

    def _payload(self, row: _Row, *, check_event: bool = True) -> tuple[Any, str | None]:
        """The row's item, or why it cannot be offered (a bounded read, never raising)."""
        if row.size > MAX_PAYLOAD_CHARS:
            return None, (f"its stored payload is {row.size} characters, more than any "
                          f"valid op or artifact ({MAX_PAYLOAD_CHARS})")
        found = self.conn.execute("SELECT payload_json FROM logsync_quarantine WHERE id = ?",
                                  (row.row_id,)).fetchone()
        text = found[0] if found is not None else None
        if not isinstance(text, str):
            return None, "its stored payload is not JSON text"
        try:
            item = json.loads(text)
        except (ValueError, RecursionError):
            return None, "its stored payload is not valid JSON"
        if not isinstance(item, Mapping):
            return None, "its stored payload is not a JSON object"
        if row.kind not in ("event", "artifact"):
            return None, f"its kind {shorten(row.kind)} is neither event nor artifact"
        if check_event:
            claimed = item.get("origin_replica")
            if (claimed if is_replica_id(claimed) else None) != row.origin or (
                    raw_seq(item) != row.seq):
                return None, ("its row's origin and seq are not its payload's (a ledger "
                              "another program wrote?)")
        return item, None

    def _settle(self, row: _Row, out: OriginRetry, outcome: str, reason: str) -> None:
        if outcome == HELD:
            self._hold(row, out, reason or row.reason)
            return
        self.conn.execute("DELETE FROM logsync_quarantine WHERE id = ?", (row.row_id,))
        if outcome == APPLIED:
            out.applied += 1
        elif outcome == CONFLICT:
            out.conflicts += 1
        else:
            out.already_held += 1

    def _hold(self, row: _Row, out: OriginRetry, reason: str,
              waits_for: int | None = None) -> None:
        row_id = row.row_id
        if reason != row.reason and waits_for is None:
            row_id = self._rewrite_reason(row, reason)
        out.held.append(HeldOp(row_id, row.kind, row.seq, reason, waits_for))

    def _rewrite_reason(self, row: _Row, reason: str) -> int:
        """The row's new reason and digest; a row that already says the same absorbs it.
        Returns the id of the row that now holds the op."""
        conn = self.conn
        found = conn.execute("SELECT payload_json, times_seen FROM logsync_quarantine "
                             "WHERE id = ?", (row.row_id,)).fetchone()
        if found is None or not isinstance(found[0], str) or row.size > MAX_PAYLOAD_CHARS:
            return row.row_id  # an unreadable payload keeps its row as it is
        digest = ledger_digest(row.kind, reason, found[0])
        twin = conn.execute("SELECT id FROM logsync_quarantine WHERE digest = ? AND id != ?",
                            (digest, row.row_id)).fetchone()
        if twin is not None:
            conn.execute("UPDATE logsync_quarantine SET times_seen = times_seen + ? "
                         "WHERE id = ?", (int(found[1] or 1), twin[0]))
            conn.execute("DELETE FROM logsync_quarantine WHERE id = ?", (row.row_id,))
            return int(twin[0])
        conn.execute("UPDATE logsync_quarantine SET reason = ?, digest = ? WHERE id = ?",
                     (reason, digest, row.row_id))
        return row.row_id

    def _top(self, origin: str) -> int:
        return int(self.conn.execute(
            "SELECT coalesce(max(origin_seq), 0) FROM events WHERE origin_replica = ?",
            (origin,)).fetchone()[0])



def _outcome(inserted: int, quarantined: int, conflicts: int) -> tuple[str, str]:
    """What one offer's `ApplyResult` counts mean for its row (a recovered own op is
    inserted and recorded: applied)."""
    if inserted:
        return APPLIED, ""
    if quarantined:
        return HELD, ""
    if conflicts:
        return CONFLICT, ""
    return ALREADY_HELD, ""
