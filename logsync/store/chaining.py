"""The per-origin hash chain as the store keeps it: table `logsync_chain`, one row per
held op, `(origin, origin_seq) -> digest` (the rule is `logsync/chain.py`).

Everything here runs inside the caller's write transaction, so an op and its chain
entry commit together. `extend_chains` is the write path (local append, `apply_remote`):
ops are only ever added above an origin's top, so their predecessor is the chain's tip.
When the tip is not the held op just below (another program, e.g. a MemPalace hub,
wrote to the file, or the store predates the table), the origin is repaired instead:
recomputed from its first held op without a chain entry, in bounded batches.
`backfill_chains` runs that check for every origin at open (`Store.open`, one
transaction, after the integrity check and the migration that creates the table).

Each entry may carry a `signature` (issue 10, item 3; `logsync/keys.py`): the origin's
Ed25519 signature over the digest. A local append signs its op (`sign`); a caller that
got signatures with remote ops passes them (`signatures`). A repair keeps a signature
only where the recomputed digest equals the one it signed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from logsync.chain import canonical_row, chain_start, compact_metadata, next_digest
from logsync.store.rows import chunks

CHAIN_DDL = (
    "CREATE TABLE IF NOT EXISTS logsync_chain (\n"
    "    origin TEXT NOT NULL,\n"
    "    origin_seq INTEGER NOT NULL,\n"
    "    digest BLOB NOT NULL,\n"
    "    signature BLOB,\n"
    "    PRIMARY KEY (origin, origin_seq)\n"
    ") WITHOUT ROWID"
)
INSERT_CHAIN = (
    "INSERT OR REPLACE INTO logsync_chain (origin, origin_seq, digest, signature) "
    "VALUES (?, ?, ?, ?)"
)
# A repair rewrites digests in place: a signature survives only an unchanged digest
# (every SET expression reads the row as it was).
REPAIR_CHAIN = (
    "INSERT INTO logsync_chain (origin, origin_seq, digest, signature) VALUES (?, ?, ?, NULL) "
    "ON CONFLICT (origin, origin_seq) DO UPDATE SET digest = excluded.digest, signature = "
    "CASE WHEN logsync_chain.digest = excluded.digest THEN logsync_chain.signature END"
)
# (origin whose ops to sign, digest -> 64-byte signature): how a local append signs.
Signer = tuple[str, Callable[[bytes], bytes]]
BACKFILL_BATCH = 5000  # events read (and digests held) at a time while repairing
# The columns of `schema.INSERT_EVENT`, in its order (the tuples `extend_chains` gets).
ROW_COLUMNS = (
    "id", "type", "stream", "room", "topic", "from_agent", "to_agent", "correlation_id",
    "branch", "base_commit", "status", "body", "created_at", "metadata_json",
    "origin_replica", "origin_seq", "hlc",
)
_ORIGIN, _SEQ = ROW_COLUMNS.index("origin_replica"), ROW_COLUMNS.index("origin_seq")
# A private switch for benchmarks/chain_backfill.py (the apply rate without the chain).
# Off, writes leave the chain behind; the next write or open with it on repairs it.
_ENABLED = True
# Every origin of the events table, by skipping along the (origin_replica, origin_seq)
# index: one seek per origin, not a scan.
# The origins held, one index seek each (events_origin_seq_idx), however many ops.
_ORIGIN_WALK = (
    "WITH RECURSIVE o(x) AS (SELECT min(origin_replica) FROM events WHERE origin_replica "
    "IS NOT NULL UNION ALL SELECT (SELECT min(origin_replica) FROM events WHERE "
    "origin_replica > x) FROM o WHERE x IS NOT NULL) "
)
ORIGINS_SQL = _ORIGIN_WALK + "SELECT x FROM o WHERE x IS NOT NULL"
# The version vector: each origin's top by a second seek (a GROUP BY reads every op's
# index entry: 66 ms at a million events, read every round).
VECTOR_SQL = (_ORIGIN_WALK + "SELECT x AS origin_replica, (SELECT max(origin_seq) FROM events "
              "WHERE origin_replica = x) AS top FROM o WHERE x IS NOT NULL")


def chain_tip(conn: sqlite3.Connection, origin: str) -> tuple[int, bytes] | None:
    row = conn.execute(
        "SELECT origin_seq, digest FROM logsync_chain WHERE origin = ? "
        "ORDER BY origin_seq DESC LIMIT 1",
        (origin,),
    ).fetchone()
    return None if row is None else (int(row[0]), bytes(row[1]))


def add_signature_column(conn: sqlite3.Connection) -> None:
    """The migration step for a chain table from before signatures (NULL: unsigned)."""
    if "signature" not in {r[1] for r in conn.execute("PRAGMA table_info(logsync_chain)")}:
        conn.execute("ALTER TABLE logsync_chain ADD COLUMN signature BLOB")


def extend_chains(
    conn: sqlite3.Connection,
    rows: Sequence[tuple[Any, ...]],
    links: Sequence[tuple[str, str]],
    signatures: Mapping[tuple[str, int], bytes] | None = None,
    *,
    sign: Signer | None = None,
    known: Mapping[tuple[str, int], tuple[bytes, bytes]] | None = None,
) -> None:
    """Chain entries for event rows just inserted (`INSERT_EVENT` tuples) and their
    `(event_id, artifact_id)` links, in the same transaction. `signatures` are stored as
    given, by `(origin, origin_seq)`; `sign` signs the new ops of its origin that have none.
    `known` holds digests already computed for these ops (a verified page,
    `pagechain.PageProof.links`): `(origin, seq) -> (digest before, digest)`, used only
    where the digest before is the one this chain reached, so it is the same hash.
    """
    if not _ENABLED or not rows:
        return
    by_origin: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_origin.setdefault(row[_ORIGIN], []).append(row)
    named: dict[str, list[str]] = {}
    for event_id, art_id in links:
        named.setdefault(event_id, []).append(art_id)
    shas = _artifact_shas(conn, sorted({a for ids in named.values() for a in ids}))
    for origin, staged in by_origin.items():
        staged.sort(key=lambda r: r[_SEQ])
        signer = sign[1] if sign is not None and sign[0] == origin else None
        prev = _predecessor(conn, origin, staged[0][_SEQ], staged[-1][_SEQ], len(staged))
        if prev is None:
            repair_origin(conn, origin)
            if signatures or signer is not None:
                _sign_entries(conn, origin, [r[_SEQ] for r in staged], signatures, signer)
            continue
        out = []
        for row in staged:
            link = known.get((origin, row[_SEQ])) if known else None
            if link is not None and link[0] == prev:
                prev = link[1]
            else:
                ids = named.get(row[0])
                pairs = {a: shas.get(a) for a in ids} if ids else {}
                prev = next_digest(prev, canonical(row, pairs))
            out.append((origin, row[_SEQ], prev,
                        _signature(origin, row[_SEQ], prev, signatures, signer)))
        conn.executemany(INSERT_CHAIN, out)


def _signature(
    origin: str, seq: int, digest: bytes, signatures: Mapping[tuple[str, int], bytes] | None,
    signer: Callable[[bytes], bytes] | None,
) -> bytes | None:
    given = signatures.get((origin, seq)) if signatures else None
    if given is None and signer is not None:
        return signer(digest)
    return given


def _sign_entries(
    conn: sqlite3.Connection, origin: str, seqs: Sequence[int],
    signatures: Mapping[tuple[str, int], bytes] | None, signer: Callable[[bytes], bytes] | None,
) -> None:
    """Signatures for the staged ops after a repair wrote their entries (it writes none
    for ops that had no entry)."""
    for seq in seqs:
        row = conn.execute(
            "SELECT digest FROM logsync_chain WHERE origin = ? AND origin_seq = ?", (origin, seq)
        ).fetchone()
        signature = None if row is None else _signature(
            origin, seq, bytes(row[0]), signatures, signer
        )
        if signature is not None:
            conn.execute(
                "UPDATE logsync_chain SET signature = ? WHERE origin = ? AND origin_seq = ?",
                (signature, origin, seq),
            )


def _predecessor(
    conn: sqlite3.Connection, origin: str, first: int, last: int, count: int
) -> bytes | None:
    """The digest the staged run [first, last] chains from, or None when the origin's
    chain is not exactly the held ops below `first` (it must be repaired)."""
    below = conn.execute(
        "SELECT max(origin_seq) FROM events WHERE origin_replica = ? AND origin_seq < ?",
        (origin, first),
    ).fetchone()[0]
    tip = chain_tip(conn, origin)
    if below is None:
        if tip is not None:
            return None
        prev = chain_start(origin)
    elif tip is None or tip[0] != below:
        return None
    else:
        prev = tip[1]
    held = conn.execute(
        "SELECT count(*) FROM events WHERE origin_replica = ? AND origin_seq BETWEEN ? AND ?",
        (origin, first, last),
    ).fetchone()[0]
    return prev if held == count else None


def backfill_chains(conn: sqlite3.Connection) -> int:
    """Bring every origin's chain up to the events held (`Store.open`, after the integrity
    check); returns how many entries were written. An origin whose chain is current costs
    a few index seeks and two counts over its index ranges (about 0.1 s at 1M ops)."""
    if not _ENABLED:
        return 0
    written = 0
    for (origin,) in conn.execute(ORIGINS_SQL).fetchall():
        if not _complete(conn, origin):
            written += repair_origin(conn, origin)
    return written


def _complete(conn: sqlite3.Connection, origin: str) -> bool:
    top, held = conn.execute(
        "SELECT max(origin_seq), count(*) FROM events WHERE origin_replica = ?", (origin,)
    ).fetchone()
    tip = chain_tip(conn, origin)
    if tip is None or tip[0] != top:
        return False
    chained = conn.execute(
        "SELECT count(*) FROM logsync_chain WHERE origin = ?", (origin,)
    ).fetchone()[0]
    return bool(chained == held)


def repair_origin(conn: sqlite3.Connection, origin: str) -> int:
    """Recompute an origin's chain from its first held op without an entry (entries above
    it are rewritten in place, keeping a signature only where the digest is unchanged;
    entries of ops no longer held are dropped); returns entries written."""
    first = conn.execute(
        "SELECT min(e.origin_seq) FROM events e LEFT JOIN logsync_chain c "
        "ON c.origin = e.origin_replica AND c.origin_seq = e.origin_seq "
        "WHERE e.origin_replica = ? AND c.digest IS NULL",
        (origin,),
    ).fetchone()[0]
    if first is None:
        first = conn.execute(  # every op has an entry: drop entries of ops not held
            "SELECT min(c.origin_seq) FROM logsync_chain c LEFT JOIN events e "
            "ON e.origin_replica = c.origin AND e.origin_seq = c.origin_seq "
            "WHERE c.origin = ? AND e.id IS NULL",
            (origin,),
        ).fetchone()[0]
        if first is None:
            return 0
    conn.execute(
        "DELETE FROM logsync_chain WHERE origin = ? AND origin_seq >= ? AND NOT EXISTS "
        "(SELECT 1 FROM events e WHERE e.origin_replica = logsync_chain.origin "
        "AND e.origin_seq = logsync_chain.origin_seq)",
        (origin, first),
    )
    row = conn.execute(
        "SELECT digest FROM logsync_chain WHERE origin = ? AND origin_seq < ? "
        "ORDER BY origin_seq DESC LIMIT 1",
        (origin, first),
    ).fetchone()
    prev = chain_start(origin) if row is None else bytes(row[0])
    written = 0
    for batch in held_ops(conn, origin, first):
        out = []
        for row, pairs in batch:
            prev = next_digest(prev, canonical(row, pairs))
            out.append((origin, row[_SEQ], prev))
        conn.executemany(REPAIR_CHAIN, out)
        written += len(out)
    return written


def held_ops(
    conn: sqlite3.Connection, origin: str, first: int
) -> Iterator[list[tuple[tuple[Any, ...], dict[str, str | None]]]]:
    """An origin's held ops from `first` on, in origin_seq order, BACKFILL_BATCH at a
    time, each with the stored sha256 of every artifact it names (None: not held)."""
    columns = ", ".join(f"e.{c}" for c in ROW_COLUMNS)
    sql = (
        f"SELECT {columns}, ea.artifact_id AS art_id, a.sha256 AS art_sha FROM "
        "(SELECT * FROM events WHERE origin_replica = ? AND origin_seq >= ? "
        "ORDER BY origin_seq LIMIT ?) e "
        "LEFT JOIN event_artifacts ea ON ea.event_id = e.id "
        "LEFT JOIN artifacts a ON a.id = ea.artifact_id "
        "ORDER BY e.origin_seq"
    )
    width = len(ROW_COLUMNS)
    while True:
        batch: list[tuple[tuple[Any, ...], dict[str, str | None]]] = []
        cursor = conn.execute(sql, (origin, first, BACKFILL_BATCH))
        cursor.row_factory = None  # plain tuples
        for row in cursor:
            if not batch or batch[-1][0][_SEQ] != row[_SEQ]:
                batch.append((row[:width], {}))
            if row[width] is not None:
                batch[-1][1][row[width]] = row[width + 1]
        if not batch:
            return
        yield batch
        if len(batch) < BACKFILL_BATCH:
            return
        first = batch[-1][0][_SEQ] + 1


def canonical(row: tuple[Any, ...], artifacts: dict[str, str | None]) -> bytes:
    """The canonical bytes of a stored row (`ROW_COLUMNS` order). A value no validated op
    holds (a number in a text column, which only another program can have written) is
    taken as its text, so a store can always be opened and chained."""
    meta = row[13]
    fields = (*row[:13], compact_metadata(meta if isinstance(meta, str) else None), *row[14:])
    try:
        return canonical_row(*fields, artifacts)
    except (TypeError, ValueError, AttributeError):
        fixed = tuple(
            v if i == _SEQ or v is None or isinstance(v, str) else str(v)
            for i, v in enumerate(fields)
        )
        return canonical_row(*fixed, artifacts)


def _artifact_shas(conn: sqlite3.Connection, ids: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for chunk in chunks(ids, 500):
        marks = ",".join("?" * len(chunk))
        out.update(
            (r[0], r[1])
            for r in conn.execute(f"SELECT id, sha256 FROM artifacts WHERE id IN ({marks})", chunk)
        )
    return out
