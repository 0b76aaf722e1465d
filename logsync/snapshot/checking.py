"""The joiner's checks of a downloaded snapshot (RFC 004 §9.6), before anything is installed.

One copy of each rule: the schema is compared with what `schema.migrate` creates, the
chains, signatures and artifact hashes are `store/audit.py`'s (`logsync verify`). What
only a whole-file copy needs is here: SQLite's integrity check, no triggers or views, no
conflict or quarantine rows, the vector the preamble names, no op of the joiner's own
origin (recovering those is the ordinary pull's job, §3.2), and every signed origin
gap-free (logsync authors count 1, 2, 3 ...; upstream origins have gaps, §6.2).

Keys follow the pull's rule (§12.2), not the source's word: a key is kept only when the
origin's id certifies it, or it is the serving peer's own (pinned, trust on first use).
Signatures of an origin left without a key are dropped, and so are those a puller would
never have stored (neither at a checkpoint nor the origin's highest signed op), since
the audit verifies exactly those. Then the joiner's own key is recorded as `self`.
Every failure raises `SnapshotRefused` with one sentence.

For speed the chains are first proven by `chaincheck.py` and the kept signatures checked
(`verify_kept_signatures`) on the file as downloaded, beside SQLite's integrity check;
the audit then recomputes only a chain not proven and rechecks only an origin whose
signatures were not all good, so its findings and sentences are the reference's.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from logsync.keys import certifies
from logsync.pagechain import CHECKPOINT
from logsync.snapshot import LOCAL_ONLY_TABLES, SnapshotRefused
from logsync.store.audit import AuditReport, UnchainableOp, audit_store, check_signatures
from logsync.store.schema import migrate, schema_problem
from logsync.store.signing_state import SIGNED_TO_SQL

ORIGINS_VECTOR_SQL = (
    "SELECT origin_replica, max(origin_seq), min(origin_seq), count(*) FROM events "
    "GROUP BY origin_replica"
)


@functools.cache
def reference_schema() -> tuple[dict[str, set[str]], set[str]]:
    """The tables (with their columns) and indexes a current logsync store has (made once
    per process; callers only read it)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        migrate(conn, "rep_000000000000")
        return _tables(conn), _indexes(conn)
    finally:
        conn.close()


def _tables(conn: sqlite3.Connection) -> dict[str, set[str]]:
    names = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    return {n: {r[1] for r in conn.execute(f'PRAGMA table_info("{n}")')} for n in names}


def _indexes(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'")}


def check_integrity(path: Path) -> None:
    """SQLite's own check of every page, row and index (C code, off the GIL: it runs
    beside the audit)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    try:
        verdict = conn.execute("PRAGMA integrity_check(1)").fetchone()[0]
        if verdict != "ok":
            raise SnapshotRefused(f"it fails SQLite's integrity check ({str(verdict)[:120]})")
    except sqlite3.DatabaseError as exc:
        raise SnapshotRefused(f"it is not a readable SQLite store ({exc})") from None
    finally:
        conn.close()


def check_readonly(path: Path, vector: Mapping[str, int], own_id: str) -> None:
    """The quick checks that need no write: schema, local rows, vector, own origin."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    try:
        _check_schema(conn)
        for table in LOCAL_ONLY_TABLES[:2]:
            if conn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone():
                raise SnapshotRefused(f"it holds rows of {table}, which never leave a replica")
        _check_vector(conn, vector, own_id)
    except sqlite3.DatabaseError as exc:
        raise SnapshotRefused(f"it is not a readable SQLite store ({exc})") from None
    finally:
        conn.close()


def _check_schema(conn: sqlite3.Connection) -> None:
    kinds = {r[0] for r in conn.execute("SELECT type FROM sqlite_master")}
    for kind in ("trigger", "view"):
        if kind in kinds:
            raise SnapshotRefused(f"it holds a {kind}, which no logsync store has")
    tables, indexes = reference_schema()
    held = _tables(conn)
    for name, columns in tables.items():
        if name not in held:
            raise SnapshotRefused(f"it lacks the table {name} a logsync store has")
        if held[name] != columns:
            raise SnapshotRefused(f"its table {name} has the columns {sorted(held[name])}, "
                                  f"not a logsync store's {sorted(columns)}")
    missing = sorted(indexes - _indexes(conn))
    if missing:
        raise SnapshotRefused(f"it lacks the index {missing[0]} a logsync store has")
    problem = schema_problem(conn)
    if problem is not None:
        raise SnapshotRefused(f"it {problem}")


def _check_vector(conn: sqlite3.Connection, vector: Mapping[str, int], own_id: str) -> None:
    held = {}
    for origin, top, low, _count in conn.execute(ORIGINS_VECTOR_SQL):
        if not isinstance(top, int) or not isinstance(low, int) or low < 1:
            raise SnapshotRefused(f"origin {origin!r} holds an origin_seq below 1 or not an "
                                  "integer")
        held[origin] = top
    if held != dict(vector):
        differ = sorted(set(held) ^ set(vector)) or sorted(
            o for o in held if held[o] != vector.get(o))
        o = differ[0]
        raise SnapshotRefused(f"it holds origin {o} up to seq {held.get(o, 0)}, not the "
                              f"{vector.get(o, 0)} its preamble names")
    if own_id in held:
        raise SnapshotRefused(f"it holds ops of this replica's own origin {own_id}, which "
                              "only the ordinary pull may recover")


def kept_source(origin: Any, key: Any, own_id: str, peer_id: str) -> str | None:
    """The pull's rule for a keyring row of the snapshot (§12.2): kept as `certified` when
    the origin's id certifies the key, as `pinned` when it is the serving peer's own (and
    not ours), else not taken (None)."""
    if certifies(origin, key):
        return "certified"
    if origin == peer_id and origin != own_id:
        return "pinned"
    return None


def verify_kept_signatures(path: Path, own_id: str, peer_id: str) -> dict[str, int]:
    """The signatures `prepare` keeps, checked now on the file as downloaded with the key
    it keeps (the same rows: a checkpoint's or the highest signed op's), beside the other
    checks: per origin whose every one verifies, how many were checked. An origin left
    out is checked again by the audit, which names the first that fails."""
    good: dict[str, int] = {}
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                               isolation_level=None)
    except sqlite3.Error:
        return good
    try:
        conn.execute("BEGIN")
        for origin, key in conn.execute(
                "SELECT origin, public_key FROM logsync_keys").fetchall():
            if kept_source(origin, key, own_id, peer_id) is None or \
                    not isinstance(key, bytes):
                continue
            top = conn.execute(SIGNED_TO_SQL, (origin,)).fetchone()
            if top is None or type(top[0]) is not int:
                continue
            try:
                checked, failed_at = check_signatures(conn, origin, key, top[0])
            except UnchainableOp:
                continue  # the audit refuses it, in its own words
            if failed_at is None:
                good[str(origin)] = checked
    except sqlite3.Error:
        return good
    finally:
        conn.close()
    return good


def prepare(path: Path, own_id: str, own_key: bytes | None, peer_id: str, now: str) -> None:
    """Rewrite what is per replica in the candidate (we own it): keys, signatures, local
    rows, unknown tables and indexes; then leave it a plain (non-WAL) file."""
    tables, indexes = reference_schema()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")  # a plain rollback-journal file
        # A temp file nobody else opens, fsynced before it is installed and removed if a
        # kill or a failure interrupts this: no journal (on disk or in memory, where a
        # copy from a server that kept every signature would hold each chain page it
        # rewrites) and no fsync per commit needed.
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("BEGIN IMMEDIATE")
        for name in set(_tables(conn)) - set(tables):
            conn.execute(f'DROP TABLE "{name}"')
        for name in _indexes(conn) - indexes:
            conn.execute(f'DROP INDEX IF EXISTS "{name}"')
        conn.execute("DELETE FROM logsync_health")
        for origin, key in conn.execute(
                "SELECT origin, public_key FROM logsync_keys").fetchall():
            source = kept_source(origin, key, own_id, peer_id)
            if source is None:  # a third party's word, or a row for our own origin
                conn.execute("DELETE FROM logsync_keys WHERE origin = ?", (origin,))
            else:
                conn.execute("UPDATE logsync_keys SET source = ? WHERE origin = ?",
                             (source, origin))
        if own_key is not None:
            conn.execute("INSERT INTO logsync_keys (origin, public_key, source, first_seen) "
                         "VALUES (?, ?, 'self', ?)", (own_id, own_key, now))
        conn.execute("UPDATE logsync_chain SET signature = NULL WHERE signature IS NOT NULL "
                     "AND origin NOT IN (SELECT origin FROM logsync_keys)")
        for origin in [r[0] for r in conn.execute("SELECT origin FROM logsync_keys")]:
            top = conn.execute(SIGNED_TO_SQL, (origin,)).fetchone()
            conn.execute("UPDATE logsync_chain SET signature = NULL WHERE origin = ? AND "
                         "signature IS NOT NULL AND origin_seq % ? != 0 AND origin_seq != ?",
                         (origin, CHECKPOINT, top[0] if top else 0))
        conn.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        raise SnapshotRefused(f"it cannot be prepared for this replica ({exc})") from None
    finally:
        conn.close()


def audit(path: Path, proven: Collection[str] = (),
          verified: Mapping[str, int] | None = None) -> dict[str, Any]:
    """`logsync verify`'s audit of the prepared candidate, plus gap-free signed origins;
    the counts it held when every check passed. The chains of `proven` origins were
    already proven on this file (`chaincheck.prove_chains`); the others are recomputed.
    The signatures of `verified` origins were checked (`verify_kept_signatures`)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        report = audit_store(conn, proven=proven, verified=verified)
        _first_failure(report)
        keyed = {r[0] for r in conn.execute("SELECT origin FROM logsync_keys")}
        for origin, top, _low, count in conn.execute(ORIGINS_VECTOR_SQL):
            if origin in keyed and count != top:
                raise SnapshotRefused(f"signed origin {origin} holds {count} ops up to seq "
                                      f"{top}: a logsync origin has no gaps")
        artifacts = conn.execute("SELECT count(*) FROM artifacts").fetchone()[0]
        events = sum(o.ops for o in report.origins)
        return {"events": events, "artifacts": int(artifacts), "origins": len(report.origins)}
    except sqlite3.DatabaseError as exc:
        raise SnapshotRefused(f"it cannot be audited ({exc})") from None
    except UnchainableOp as exc:
        raise SnapshotRefused(f"it holds an op no chain can be computed over ({exc})") \
            from None
    finally:
        conn.close()


def _first_failure(report: AuditReport) -> None:
    for origin in report.origins:
        if origin.problem is not None:
            p = origin.problem
            raise SnapshotRefused(f"the chain of origin {origin.origin} departs from its ops "
                                  f"at seq {p.seq} ({p.kind})")
        if origin.signature is not None and not origin.signature.ok:
            raise SnapshotRefused(f"the signature of origin {origin.origin} at seq "
                                  f"{origin.signature.failed_at} does not verify")
    if not report.artifacts.ok:
        bad = report.artifacts.bad[0]
        raise SnapshotRefused(f"artifact {bad.id}: {bad.reason}")
