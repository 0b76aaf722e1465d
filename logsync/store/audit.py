"""Re-check a whole store (`logsync verify`, issue 10, item 5): pure store logic, read-only.

Every origin's chain is recomputed from its held ops with the write path's own helpers
(`chaining.held_ops`, `chaining.canonical`, `logsync.chain`) and merged, in origin_seq
order, against the stored `logsync_chain` rows: the first seq where a stored digest
differs, is missing (an op without an entry) or is extra (an entry without an op) is
reported. A chain commits to each artifact's *stored* sha256, so every artifact is also
re-hashed from its content and compared with its stored sha256 and size_bytes: together
they cover one changed byte anywhere in an op or an artifact.

Signatures (RFC 004 §12.2): for an origin whose key we know, the stored signatures are
verified against the stored digests (`keys.verify_digest`), which the chain check ties to
the ops. Bounded like a page check: only the signatures at checkpoints (every
`pagechain.CHECKPOINT`th seq) and the highest signed seq, about one op in 64, are
checked; a signature elsewhere (a local append signs every op) is not read. The first
seq whose signature fails is reported. The origin's signing state (`signed_to`, the ops
above it that no signature covers) comes from `store/signing_state.py`, as in `info`.

Nothing is repaired (a writable `Store.open` repairs an incomplete chain: that would hide
what this reports). Memory is bounded: ops come `BACKFILL_BATCH` at a time, stored chain
rows in pages of the same size, artifacts one row at a time. The whole audit reads one
snapshot (one read transaction), so a writer committing meanwhile cannot show up as a
spurious missing or extra entry.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from logsync.chain import chain_start, next_digest
from logsync.keys import verify_digest
from logsync.model import sha256_hex
from logsync.pagechain import CHECKPOINT
from logsync.store.chaining import BACKFILL_BATCH, ORIGINS_SQL, ROW_COLUMNS, canonical, held_ops
from logsync.store.keyring import known_key
from logsync.store.signing_state import SigningState, signing_states

MAX_BAD_ARTIFACTS = 20  # named in a report; the rest are only counted
LOWEST_SEQ = -(2**63)  # held_ops from the very first op, whatever another writer stored
_SEQ = ROW_COLUMNS.index("origin_seq")
# Every origin of the chain table, one seek per origin along its primary key.
CHAIN_ORIGINS_SQL = (
    "WITH RECURSIVE o(x) AS (SELECT min(origin) FROM logsync_chain UNION ALL "
    "SELECT (SELECT min(origin) FROM logsync_chain WHERE origin > x) FROM o "
    "WHERE x IS NOT NULL) SELECT x FROM o WHERE x IS NOT NULL"
)
# Content as stored bytes: a byte flipped on disk is a hash mismatch, not a decode error.
ARTIFACTS_SQL = (
    "SELECT id, sha256, size_bytes, typeof(content), CAST(content AS BLOB) FROM artifacts "
    "ORDER BY id"
)
_TEXT_CODECS = {"UTF-8": "utf-8", "UTF-16le": "utf-16-le", "UTF-16be": "utf-16-be"}


@dataclass(frozen=True)
class ChainProblem:
    """The first seq where an origin's stored chain departs from the recomputation."""

    seq: int
    kind: str  # "mismatch" | "missing" (op without entry) | "extra" (entry without op)
    stored: str | None  # hex digest stored at seq (None: missing)
    recomputed: str | None  # hex digest recomputed at seq (None: extra)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "stored": self.stored,
                "recomputed": self.recomputed}


@dataclass(frozen=True)
class SignatureAudit:
    """One origin's stored signatures checked against its key (an unsigned origin has
    no key to check with: nothing checked)."""

    signing: SigningState
    checked: int  # signatures verified (checkpoints and the highest signed seq)
    failed_at: int | None  # the first checked seq whose signature does not verify

    @property
    def ok(self) -> bool:
        return self.failed_at is None

    def to_json(self) -> dict[str, Any]:
        return {**self.signing.to_json(), "checked": self.checked, "ok": self.ok,
                "failed_at": self.failed_at}

    def summary(self) -> str:
        s = self.signing
        if self.failed_at is not None:
            return f"signature BAD at seq {self.failed_at} ({s.state} origin)"
        if s.state == "unsigned":
            return f"unsigned ({s.unproven} unproven)"
        return f"signatures ok ({self.checked} checked, signed to {s.signed_to}, " \
               f"{s.unproven} unproven)"


@dataclass(frozen=True)
class OriginAudit:
    """One origin: what is held, what is chained, and the first departure if any."""

    origin: str
    ops: int
    top: int | None  # highest held origin_seq (None: no op held)
    entries: int  # rows in logsync_chain
    problem: ChainProblem | None
    # Per-origin signature check (RFC 004 §12.2); None only where it was not run.
    signature: SignatureAudit | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and (self.signature is None or self.signature.ok)

    def to_json(self) -> dict[str, Any]:
        return {"origin": self.origin, "ops": self.ops, "top": self.top,
                "chain_entries": self.entries, "chain_ok": self.problem is None,
                "problem": None if self.problem is None else self.problem.to_json(),
                "signature": None if self.signature is None else self.signature.to_json()}


@dataclass(frozen=True)
class BadArtifact:
    """An artifact whose content no longer matches its stored sha256 or size_bytes."""

    id: str
    reason: str
    stored_sha256: Any
    actual_sha256: str | None  # None: the content is not valid UTF-8 text
    stored_size: Any
    actual_size: int | None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "reason": self.reason, "stored_sha256": self.stored_sha256,
                "actual_sha256": self.actual_sha256, "stored_size": self.stored_size,
                "actual_size": self.actual_size}


@dataclass(frozen=True)
class ArtifactAudit:
    checked: int
    bad_count: int
    bad: tuple[BadArtifact, ...]  # the first MAX_BAD_ARTIFACTS, by id

    @property
    def ok(self) -> bool:
        return self.bad_count == 0

    def to_json(self) -> dict[str, Any]:
        return {"checked": self.checked, "ok": self.ok, "bad_count": self.bad_count,
                "bad": [b.to_json() for b in self.bad]}


@dataclass(frozen=True)
class AuditReport:
    origins: tuple[OriginAudit, ...]
    artifacts: ArtifactAudit

    @property
    def ok(self) -> bool:
        return self.artifacts.ok and all(o.ok for o in self.origins)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "origins": [o.to_json() for o in self.origins],
                "artifacts": self.artifacts.to_json()}


def audit_store(conn: sqlite3.Connection, origin: str | None = None, *,
                proven: Collection[str] = (),
                verified: Mapping[str, int] | None = None) -> AuditReport:
    """Every origin's chain (or only `origin`'s) and every artifact, in one read snapshot.

    The chains of the origins in `proven` are not recomputed here: the caller proved them
    equal to the recomputation on this same file (`snapshot/chaincheck.py`); nor are the
    signatures of those in `verified` (origin -> how many were checked, all good)."""
    verified = verified or {}
    began = not conn.in_transaction
    if began:
        conn.execute("BEGIN")
    try:
        if origin is None:
            names = {r[0] for r in conn.execute(ORIGINS_SQL).fetchall()}
            names.update(r[0] for r in conn.execute(CHAIN_ORIGINS_SQL).fetchall())
            origins = tuple(audit_origin(conn, o, o in proven, verified.get(o))
                            for o in sorted(names, key=str))
        else:
            origins = (audit_origin(conn, origin, origin in proven, verified.get(origin)),)
        return AuditReport(origins, audit_artifacts(conn))
    finally:
        if began and conn.in_transaction:
            conn.execute("ROLLBACK")  # it only read


def audit_origin(conn: sqlite3.Connection, origin: str, proven: bool = False,
                 verified: int | None = None) -> OriginAudit:
    ops, top = conn.execute(
        "SELECT count(*), max(origin_seq) FROM events WHERE origin_replica = ?", (origin,)
    ).fetchone()
    entries = conn.execute(
        "SELECT count(*) FROM logsync_chain WHERE origin = ?", (origin,)
    ).fetchone()[0]
    return OriginAudit(origin, int(ops), None if top is None else int(top), int(entries),
                       None if proven else first_problem(conn, origin),
                       audit_signatures(conn, origin, verified))


def audit_signatures(conn: sqlite3.Connection, origin: str,
                     verified: int | None = None) -> SignatureAudit:
    """Verify the origin's stored signatures at checkpoints and at its highest signed
    seq against the stored digests, in seq order; stop at the first that fails.
    `verified`: the caller already checked these same signatures with this same key
    on this file (that many, all good): they are not checked again."""
    signing = signing_states(conn, [origin])[origin]
    key = known_key(conn, origin)
    if key is None or not signing.signed_to:
        return SignatureAudit(signing, 0, None)
    if verified is not None:
        return SignatureAudit(signing, verified, None)
    checked, failed_at = check_signatures(conn, origin, key, signing.signed_to)
    return SignatureAudit(signing, checked, failed_at)


def check_signatures(conn: sqlite3.Connection, origin: str, key: bytes,
                     signed_to: int) -> tuple[int, int | None]:
    """(signatures checked, the first seq whose signature fails or None): those at
    checkpoints and at `signed_to`, one row in memory at a time."""
    checked = 0
    rows = conn.execute(
        "SELECT origin_seq, digest, signature FROM logsync_chain WHERE origin = ? "
        "AND signature IS NOT NULL AND (origin_seq % ? = 0 OR origin_seq = ?) "
        "ORDER BY origin_seq",
        (origin, CHECKPOINT, signed_to),
    )
    for seq, digest, signature in rows:
        if type(seq) is not int:  # e.g. -9e999, stored as REAL -inf (and -inf % n = 0)
            rows.close()
            raise UnchainableOp(f"origin {origin} holds a chain entry at seq {seq!r}, "
                                "not an integer")
        checked += 1
        if not verify_digest(key, digest, signature):
            rows.close()
            return checked, seq
    return checked, None


def first_problem(conn: sqlite3.Connection, origin: str) -> ChainProblem | None:
    """Merge the recomputed and the stored chain by seq; stop at the first departure
    (every later digest of the origin depends on it)."""
    computed, stored = _recomputed(conn, origin), _stored(conn, origin)
    op, entry = next(computed, None), next(stored, None)
    while op is not None or entry is not None:
        if entry is None or (op is not None and op[0] < entry[0]):
            assert op is not None
            return ChainProblem(op[0], "missing", None, op[1].hex())
        if op is None or entry[0] < op[0]:
            return ChainProblem(entry[0], "extra", _hex(entry[1]), None)
        if entry[1] != op[1]:
            return ChainProblem(op[0], "mismatch", _hex(entry[1]), op[1].hex())
        op, entry = next(computed, None), next(stored, None)
    return None


class UnchainableOp(ValueError):
    """An op the chain rule cannot be computed over (another program wrote a NULL where
    the rule needs text, or a seq that is not an integer): named, not a traceback."""


def _recomputed(conn: sqlite3.Connection, origin: str) -> Iterator[tuple[int, bytes]]:
    """`(origin_seq, digest)` of every held op, by the rule the write path uses."""
    prev = chain_start(origin)
    for batch in held_ops(conn, origin, LOWEST_SEQ):
        for row, pairs in batch:
            try:
                prev = next_digest(prev, canonical(row, pairs))
            except (TypeError, ValueError, AttributeError) as exc:
                raise UnchainableOp(f"origin {origin} seq {row[_SEQ]!r}: {exc}") from None
            yield row[_SEQ], prev


def _stored(conn: sqlite3.Connection, origin: str) -> Iterator[tuple[int, Any]]:
    """`(origin_seq, digest)` of every stored chain row, a page at a time."""
    first = LOWEST_SEQ
    while True:
        rows = conn.execute(
            "SELECT origin_seq, digest FROM logsync_chain WHERE origin = ? AND origin_seq >= ? "
            "ORDER BY origin_seq LIMIT ?",
            (origin, first, BACKFILL_BATCH),
        ).fetchall()
        for seq, digest in rows:
            yield int(seq), bytes(digest) if isinstance(digest, bytes | memoryview) else digest
        if len(rows) < BACKFILL_BATCH or int(rows[-1][0]) >= 2**63 - 1:
            return
        first = int(rows[-1][0]) + 1


def _hex(digest: Any) -> str:
    """A stored digest as hex; a value another program stored as text is shown as such."""
    return digest.hex() if isinstance(digest, bytes) else f"<{type(digest).__name__} {digest!r}>"


def audit_artifacts(conn: sqlite3.Connection) -> ArtifactAudit:
    """Re-hash every artifact's content (`model.sha256_hex`, the hash every write and
    every remote artifact is checked with) and compare sha256 and size_bytes."""
    encoding = conn.execute("PRAGMA encoding").fetchone()[0]
    codec = _TEXT_CODECS.get(encoding, "utf-8")
    checked, bad_count, bad = 0, 0, []
    cursor = conn.execute(ARTIFACTS_SQL)
    for art_id, stored_sha, stored_size, kind, raw in cursor:  # one row in memory at a time
        checked += 1
        found = _check_artifact(str(art_id), stored_sha, stored_size, kind, raw, codec)
        if found is not None:
            bad_count += 1
            if len(bad) < MAX_BAD_ARTIFACTS:
                bad.append(found)
    return ArtifactAudit(checked, bad_count, tuple(bad))


def _check_artifact(
    art_id: str, stored_sha: Any, stored_size: Any, kind: str, raw: bytes | None, codec: str
) -> BadArtifact | None:
    if kind != "text" or raw is None:
        return BadArtifact(art_id, f"content is stored as {kind}, not text", stored_sha, None,
                           stored_size, None)
    try:
        text = raw.decode(codec)
        data = text.encode("utf-8")  # what size_bytes counts (raw itself in a UTF-8 store)
    except UnicodeError:
        return BadArtifact(art_id, "content is not valid UTF-8 text", stored_sha, None,
                           stored_size, None)
    actual_sha, actual_size = sha256_hex(text), len(data)
    reasons = []
    if stored_sha != actual_sha:
        reasons.append("sha256 differs from the content's")
    if type(stored_size) is not int or stored_size != actual_size:
        reasons.append("size_bytes differs from the content's")
    if not reasons:
        return None
    return BadArtifact(art_id, " and ".join(reasons), stored_sha, actual_sha, stored_size,
                       actual_size)
