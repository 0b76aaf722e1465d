"""Applying a page of remote ops: DESIGN.md invariants 1-6 in one transaction.

Artifacts first (an artifact id held with other content is an `artifact` conflict). Then,
per origin, ops are taken in origin_seq order. An op that fails validation is quarantined
and stops its origin. A valid op meets the checks of `APPLY_CHECKS` in this order, and
the first that answers decides (none answers: the op is inserted). The order is part of
the spec (the kinds are RFC 004 §10.2): an op we hold is a duplicate although its id is
held too, a fork although it may also sit below the high-water mark, and so on down.

  1. duplicate         (origin, origin_seq) held or earlier in this call, same content: skip
  2. fork              (origin, origin_seq) held or earlier in this call, other content:
                       conflict; stops the origin (what follows descends from the other
                       copy), but for our own origin (ops of ours lost in a restore above
                       it are recovered, so no slot is used twice)
  3. forged_origin     claims our origin and is not an op of ours we lost (at or below our
                       top, or stamped beyond the drift bound), or is one but unproven (no
                       signature of ours: it came through a peer without chains): conflict,
                       skip
  4. id_collision      its id is held, or applied in this call, under another key: conflict,
                       stop the origin
  5. history_rewrite   origin_seq at or below the origin's high-water mark, never held:
                       conflict, skip
  6. missing_artifact  names an artifact neither stored nor in this call: quarantine, stop
  7. restored_replica  claims our origin (an op of ours we lost, as 3 let it by): conflict,
                       and the op is inserted (recovered)

A conflict never overwrites; a stop holds only that origin for the rest of the call.
Conflict and quarantine rows are deduplicated by a digest; seeing one again bumps a counter.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from logsync import hlc as hlc_mod
from logsync import model, remoteops
from logsync.chain import chain_start
from logsync.errors import ValidationError
from logsync.replica import is_replica_id
from logsync.store import chaining, fastpage
from logsync.store.chaining import extend_chains
from logsync.store.ledgers import (
    conflict_row,
    quarantine_row,
    raw_seq,
    record_conflicts,
    record_quarantine,
)
from logsync.store.rows import (
    artifact_dict,
    artifact_wire,
    chunks,
    group_by_origin,
    row_wire,
    same_artifact,
    same_event,
)
from logsync.store.schema import INSERT_ARTIFACT, INSERT_EVENT

# What a check decides for one op: store it, leave it (the origin goes on), or leave it
# and stop its origin for the rest of the call.
INSERT, SKIP, STOP = "insert", "skip", "stop"


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
    diverged: dict[str, int] = field(default_factory=dict)  # origin -> seq (`ApplyPage.prev`)


@dataclass
class _ApplyState:
    """Mutable bookkeeping for one apply transaction."""

    now: str
    now_ms: int = 0
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


def apply_page(
    conn: sqlite3.Connection,
    replica_id: str,
    events: Sequence[Any],
    artifacts: Sequence[Any],
    now_ms: int,
    *,
    own_verified: bool = True,
    known: Mapping[tuple[str, int], tuple[bytes, bytes]] | None = None,
) -> ApplyResult:
    """Apply inside the caller's transaction; returns what it did. `own_verified` False:
    ops of our own origin in this call carry no proof of our signature, so none is
    recovered (check 3). `known`: chain digests a verified page already computed
    (`chaining.extend_chains`)."""
    if known is None and events:  # a page with a proof comes through `apply_prepared`
        fast = _fresh_page(conn, replica_id, events, artifacts, now_ms)
        if fast is not None:
            return fast
    state = _ApplyState(now=model.utc_now_iso(now_ms), now_ms=now_ms)
    applier = _Applier(conn, replica_id, state)
    applier.own_verified = own_verified
    applier.apply_artifacts(artifacts)
    for origin, ops in group_by_origin(events).items():
        applier.apply_origin(origin, ops)
    if state.events:
        conn.executemany(INSERT_EVENT, state.events)
    if state.links:
        conn.executemany(
            "INSERT OR IGNORE INTO event_artifacts (event_id, artifact_id) VALUES (?, ?)",
            state.links,
        )
    extend_chains(conn, state.events, state.links, known=known)  # same transaction
    record_ledgers(conn, state)
    return ApplyResult(
        applied=len(state.events), duplicates=state.duplicates,
        conflicts=len(state.conflicts), quarantined=len(state.quarantine),
        artifacts_applied=state.artifacts_applied, high_water=state.high_water,
        stopped=state.stopped, applied_per_origin=state.per_origin,
    )


def apply_prepared(
    conn: sqlite3.Connection, replica_id: str, prepared: fastpage.Prepared,
    artifacts: Sequence[Any], top: int, tip: tuple[int, bytes] | None, now_ms: int,
) -> ApplyResult | None:
    """A page `fastpage.prepare_page` prepared, if `fastpage.fresh` holds for it (else
    None, nothing written): its artifacts as `apply_artifacts` takes them, then its ops."""
    validated = fastpage.fresh(conn, prepared, tip, top, artifacts)
    if validated is None:
        return None
    state = _ApplyState(now=model.utc_now_iso(now_ms), now_ms=now_ms)
    _Applier(conn, replica_id, state).apply_artifacts(artifacts, validated)
    fastpage.write_prepared(conn, prepared)
    record_ledgers(conn, state)
    n, origin = len(prepared.rows), prepared.origin
    return ApplyResult(applied=n, conflicts=len(state.conflicts),
                       quarantined=len(state.quarantine), artifacts_applied=state.artifacts_applied,
                       high_water={origin: prepared.last}, applied_per_origin={origin: n})


def _fresh_page(conn: sqlite3.Connection, replica_id: str, events: Sequence[Any],
                artifacts: Sequence[Any], now_ms: int) -> ApplyResult | None:
    """The fast path of a page without a proof: one origin, not ours, all ops above its
    top, chained from our tip (`store/fastpage.py`); None: judge it op by op."""
    origin = events[0].get("origin_replica") if isinstance(events[0], Mapping) else None
    if not chaining._ENABLED or not isinstance(origin, str) or origin == replica_id \
            or not is_replica_id(origin):
        return None
    top, tip = fastpage.origin_state(conn, origin)
    prev = chain_start(origin) if tip is None else tip[1]
    prepared = fastpage.prepare_page(events, origin, top, prev,
                                     fastpage.page_shas(conn, events, artifacts), None, None)
    if prepared is None:
        return None
    return apply_prepared(conn, replica_id, prepared, artifacts, top, tip, now_ms)


@dataclass(slots=True)
class _Subject:
    """One validated op as the apply checks see it."""

    row: dict[str, Any]  # the validated row
    op: Any  # the op as the peer sent it (what conflicts and quarantine record)
    seq: int
    origin: str
    held: dict[str, Any] | None  # what this replica holds under (origin, seq), or None
    by_id: dict[str, sqlite3.Row]  # stored events sharing an id with this origin's ops
    top: int  # the origin's high-water mark before this op


class _Applier:
    """The decisions of one apply call, over one connection inside one transaction."""

    own_verified = True  # ops of our origin here are proven ours (see `apply_page`)

    def __init__(self, conn: sqlite3.Connection, replica_id: str, state: _ApplyState) -> None:
        self.conn = conn
        self.replica_id = replica_id
        self.state = state

    def apply_artifacts(self, artifacts: Sequence[Any], validated: dict | None = None) -> None:
        """`validated`: these artifacts already validated (`fastpage.carried_artifacts`)."""
        conn, state = self.conn, self.state
        valid: dict[str, dict[str, Any]] = {} if validated is None else validated
        for raw in artifacts if validated is None else ():
            try:
                art = model.validate_remote_artifact(raw)
            except ValidationError as exc:
                _quarantine(state, "artifact", raw, str(exc))
                continue
            valid.setdefault(art["id"], art)
        existing = fetch_by_ids(conn, "SELECT * FROM artifacts WHERE id IN ({})", list(valid))
        rows = []
        for art_id, art in valid.items():
            have = existing.get(art_id)
            if have is None:
                rows.append((
                    art_id, art["kind"], art["sha256"], art["size_bytes"], art["content"],
                    art["created_by"], art["created_at"], art["metadata_json"],
                    art["origin_replica"],
                ))
            elif not same_artifact(have, art):
                _conflict(state, "artifact", art_id, None, None,
                          "an artifact with this id but different content is already stored",
                          artifact_dict(have), artifact_wire(art))
            state.known_artifacts.add(art_id)
        fastpage.insert_rows(conn, INSERT_ARTIFACT, rows)
        state.artifacts_applied += len(rows)

    def apply_origin(self, origin: str, ops: list[Any]) -> None:
        """Apply one origin's ops in origin_seq order, stopping at the first bad one."""
        conn, state = self.conn, self.state
        if not is_replica_id(origin):
            # No history to keep a prefix of, and not a safe SQL value: refuse each op.
            for op in ops:
                _quarantine(state, "event", op, _validation_error(op))
            self._stop(origin, "origin_replica is not a replica id")
            return
        seqs = [s for s in (raw_seq(op) for op in ops) if s is not None]
        by_seq = _existing_by_seq(conn, origin, seqs)
        ids = [  # only well-formed ids are safe to look up (a lone surrogate is not)
            op["id"]
            for op in ops
            if isinstance(op, Mapping)
            and isinstance(op.get("id"), str)
            and model.ID_RE.fullmatch(op["id"])
        ]
        by_id = fetch_by_ids(conn, "SELECT rowid, * FROM events WHERE id IN ({})", ids)
        top = conn.execute(
            "SELECT coalesce(max(origin_seq), 0) FROM events WHERE origin_replica = ?", (origin,)
        ).fetchone()[0]
        batch_keys: dict[int, dict[str, Any]] = {}
        for op in ops:
            try:
                row = remoteops.validate_remote_event(op)
            except ValidationError as exc:
                self._stop(origin, _quarantine(state, "event", op, str(exc)))
                break
            outcome = self._classify(row, op, by_seq, by_id, batch_keys, top)
            if outcome == STOP:
                break
            if outcome == INSERT:
                batch_keys[row["origin_seq"]] = row
                self._stage_insert(row)
                top = max(top, row["origin_seq"])
        if is_replica_id(origin):
            state.high_water[origin] = max(top, state.high_water.get(origin, 0))

    def _classify(
        self,
        row: dict[str, Any],
        op: Any,
        by_seq: dict[int, sqlite3.Row],
        by_id: dict[str, sqlite3.Row],
        batch: dict[int, dict[str, Any]],
        top: int,
    ) -> str:
        """Decide one validated op: INSERT, SKIP (duplicate/conflict) or STOP, by the first
        of `APPLY_CHECKS` that answers."""
        seq = row["origin_seq"]
        held = batch.get(seq)
        if held is None and seq in by_seq:
            held = self._stored_row(by_seq[seq])
        subject = _Subject(row, op, seq, row["origin_replica"], held, by_id, top)
        for _name, check in APPLY_CHECKS:
            outcome = check(self, subject)
            if outcome is not None:
                return outcome
        return INSERT

    # ── the checks, in the order of APPLY_CHECKS ─────────────────────

    def _duplicate(self, s: _Subject) -> str | None:
        if s.held is None or not same_event(s.held, s.row):
            return None
        self.state.duplicates += 1
        return SKIP

    def _fork(self, s: _Subject) -> str | None:
        if s.held is None or same_event(s.held, s.row):
            return None
        self._record(s, "fork", "the same (origin_replica, origin_seq) arrived with different "
                     "content", row_wire(s.held))
        if s.origin == self.replica_id:
            return SKIP
        self._stop(s.origin, STOP_FORK)
        return STOP

    def _forged_origin(self, s: _Subject) -> str | None:
        if s.origin != self.replica_id:
            return None
        if not self._recoverable(s.row, s.seq, s.top):
            self._record(s, "forged_origin", "an op claims this replica as its origin but "
                         "this replica never wrote it")
        elif not self.own_verified:
            self._record(s, "forged_origin", "an op of this replica's origin above what it "
                         "holds came without this replica's signature (through a peer that "
                         "cannot carry signatures), so it is not recovered; a logsync peer "
                         "holding it signed can restore it")
        else:
            return None
        return SKIP

    def _id_collision(self, s: _Subject) -> str | None:
        if s.row["id"] not in s.by_id and s.row["id"] not in self.state.applied_ids:
            return None
        have = s.by_id.get(s.row["id"])
        self._record(s, "id_collision", "an event with this id already exists under another "
                     "(origin, origin_seq)", self._stored_row(have) if have is not None else None)
        self._stop(s.origin, STOP_ID_COLLISION)
        return STOP

    def _history_rewrite(self, s: _Subject) -> str | None:
        if s.seq > s.top:
            return None
        self._record(s, "history_rewrite", f"origin_seq {s.seq} is at or below this origin's "
                     f"high-water mark {s.top} but was never held here: the origin's history "
                     "changed")
        return SKIP

    def _missing_artifact(self, s: _Subject) -> str | None:
        missing = [a for a in s.row["artifact_ids"] if not self._has_artifact(a)]
        if not missing:
            return None
        reason = f"names artifact {missing[0]!r}, which is not present"
        self._stop(s.origin, _quarantine(self.state, "event", s.op, reason))
        return STOP

    def _restored_replica(self, s: _Subject) -> str | None:
        if s.origin != self.replica_id:
            return None
        self._record(s, "restored_replica", "a peer holds this replica's own op above its last "
                     "origin_seq: the palace was restored from an older copy or cloned; the op "
                     "was recovered")
        return INSERT

    def _record(self, s: _Subject, kind: str, reason: str, local: Any = None) -> None:
        """A conflict about this op: what we hold (`local`, if anything) and what came."""
        _conflict(self.state, kind, s.row["id"], s.origin, s.seq, reason, local, s.op)

    def _recoverable(self, row: dict[str, Any], seq: int, top: int) -> bool:
        """Our own op, above everything we hold, that a peer still has: this palace was
        restored from an older copy (or cloned). Taking it back means our next local op
        gets a fresh origin_seq instead of forking one the fleet already holds; it is
        recorded as a `restored_replica` conflict so the event is never silent. A stamp
        beyond the drift bound is refused: it would drag our own clock forward."""
        stamp = hlc_mod.parse(row["hlc"])
        if seq <= top or stamp is None:
            return False
        return stamp.ms <= self.state.now_ms + hlc_mod.MAX_FUTURE_DRIFT_MS

    def _stop(self, origin: str, reason: str) -> None:
        self.state.stopped.setdefault(origin, reason)

    def _has_artifact(self, art_id: str) -> bool:
        state = self.state
        if art_id in state.known_artifacts:
            return True
        found = self.conn.execute("SELECT 1 FROM artifacts WHERE id = ?", (art_id,)).fetchone()
        if found:
            state.known_artifacts.add(art_id)
        return bool(found)

    def _stored_row(self, row: sqlite3.Row) -> dict[str, Any]:
        return stored_row(self.conn, row)

    def _stage_insert(self, row: dict[str, Any]) -> None:
        state = self.state
        state.events.append((
            row["id"], row["type"], row["stream"], row["room"], row["topic"], row["from_agent"],
            row["to_agent"], row["correlation_id"], row["branch"], row["base_commit"],
            row["status"], row["body"], row["created_at"], row["metadata_json"],
            row["origin_replica"], row["origin_seq"], row["hlc"],
        ))
        state.links.extend((row["id"], a) for a in row["artifact_ids"])
        state.applied_ids.add(row["id"])
        origin = row["origin_replica"]
        state.per_origin[origin] = state.per_origin.get(origin, 0) + 1


Check = Callable[[_Applier, _Subject], str | None]

# The apply checks in their order (see the module docstring): (name, check). A check
# returns None to pass the op on, or what to do with it.
APPLY_CHECKS: tuple[tuple[str, Check], ...] = (
    ("duplicate", _Applier._duplicate),
    ("fork", _Applier._fork),
    ("forged_origin", _Applier._forged_origin),
    ("id_collision", _Applier._id_collision),
    ("history_rewrite", _Applier._history_rewrite),
    ("missing_artifact", _Applier._missing_artifact),
    ("restored_replica", _Applier._restored_replica),
)


# Stops recorded as conflicts (`logsync conflicts`); every other stop holds its op in
# quarantine (`logsync quarantine`).
STOP_FORK, STOP_ID_COLLISION = "fork", "id collision"
CONFLICT_STOPS = (STOP_FORK, STOP_ID_COLLISION)


# How far past our own top a slot refused as forged may push our counter. A restored
# palace is rarely a million ops behind; a larger jump is a forgery meant to burn the
# counter (it stays recorded as a conflict either way).
MAX_SLOT_SKIP = 1_000_000
REFUSED_OWN_TOP_SQL = (
    "SELECT coalesce(max(origin_seq), 0) FROM logsync_conflicts "
    "WHERE origin_replica = ? AND kind = 'forged_origin'"
)


def next_own_seq(conn: sqlite3.Connection, replica_id: str, top: int) -> int:
    """The origin_seq of our next local op: above everything we hold and above any slot of
    ours a peer holds that we refused (a far-future stamp), so a new op never re-uses a
    slot the fleet already has (it would reach no one)."""
    refused = int(conn.execute(
        REFUSED_OWN_TOP_SQL + " AND origin_seq <= ?",
        (replica_id, min(top + MAX_SLOT_SKIP, model.MAX_SEQ - 1)),
    ).fetchone()[0])
    return max(top, refused) + 1


def stored_row(conn: sqlite3.Connection, row: sqlite3.Row) -> dict[str, Any]:
    """A stored event in the validated-row shape, for content comparison."""
    links = conn.execute(
        "SELECT artifact_id FROM event_artifacts WHERE event_id = ? ORDER BY artifact_id",
        (row["id"],),
    ).fetchall()
    stored = {k: row[k] for k in row.keys() if k != "rowid"}
    stored["artifact_ids"] = [link[0] for link in links]
    return stored


def _validation_error(op: Any) -> str:
    try:
        remoteops.validate_remote_event(op)
    except ValidationError as exc:
        return str(exc)
    return "origin_replica is not a replica id"


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


def fetch_by_ids(conn: sqlite3.Connection, sql: str, ids: list[str]) -> dict[str, sqlite3.Row]:
    out: dict[str, sqlite3.Row] = {}
    for chunk in chunks(sorted(set(ids)), 500):
        rows = conn.execute(sql.format(",".join("?" * len(chunk))), chunk).fetchall()
        out.update((r["id"], r) for r in rows)
    return out


def _quarantine(state: _ApplyState, kind: str, item: Any, reason: str) -> str:
    state.quarantine.append(quarantine_row(state.now, kind, item, reason))
    return reason


def _conflict(
    state: _ApplyState, kind: str, item_id: str, origin: str | None, seq: int | None,
    reason: str, local: Any, remote: Any,
) -> None:
    state.conflicts.append(conflict_row(state.now, kind, item_id, origin, seq, reason, local,
                                        remote))


def record_ledgers(conn: sqlite3.Connection, state: _ApplyState) -> None:
    record_conflicts(conn, state.conflicts)
    record_quarantine(conn, state.quarantine)
