"""What the chain lets a replica say and compare: its tips, its digest at any seq, and
the record of a divergence found against a peer (issue 10, item 2).

The chain digest *at* a seq ``s`` of origin ``O``, ``D(s)``, is the digest of the highest
held op of ``O`` with ``origin_seq <= s`` (``d_0`` of ``O`` when none is held): two
replicas holding the same ops of ``O`` up to ``s`` agree on ``D(s)``, and the first ``s``
where they disagree is the first seq where one holds an op the other does not hold the
same way. Above the chain's tip ``D`` is unknown (None): another program may have
written ops the chain does not cover yet.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from logsync import model, remoteops
from logsync.chain import chain_start
from logsync.errors import StoreError, ValidationError
from logsync.keys import sign_digest, verify_digest
from logsync.pagechain import CHECKPOINT, UNSIGNED, PageProof, verify_page
from logsync.store import chaining
from logsync.store.apply import ApplyResult, apply_page, apply_prepared, stored_row
from logsync.store.chaining import repair_origin
from logsync.store.fastpage import Prepared, origin_state, page_shas, prepare_page
from logsync.store.faults import describe_fault
from logsync.store.keyring import held_key, known_key, pin_published, published_outcome
from logsync.store.ledgers import conflict_row, quarantine_row, record_conflicts, record_quarantine
from logsync.store.rows import chunks, row_wire, same_event

DIGEST_AT_SQL = (
    "SELECT digest FROM logsync_chain WHERE origin = ? AND origin_seq <= ? "
    "ORDER BY origin_seq DESC LIMIT 1"
)
TIP_SQL = (
    "SELECT origin_seq, digest FROM logsync_chain WHERE origin = ? "
    "ORDER BY origin_seq DESC LIMIT 1"
)
# The ops of each side recorded per divergence (the first differing ones), so a long
# fork costs a bounded ledger, and the rest is found again by the next search.
MAX_FORKS_RECORDED = 500
_page_shas = page_shas  # its name before it moved to `fastpage` (tests import it)
MAX_TIP_SIGNATURES = 4096  # per vector answer: a huge one costs a bounded apply
MAX_KEY_CHANGES_RECORDED = 16  # per vector answer: a peer inventing keys cannot flood the ledger


def digests_at(conn: sqlite3.Connection, origin: str, seqs: Iterable[int]) -> list[bytes | None]:
    """``D(s)`` for each seq (None above the chain's tip or for a seq below 0)."""
    tip = conn.execute(TIP_SQL, (origin,)).fetchone()
    top = int(tip[0]) if tip is not None else 0
    out: list[bytes | None] = []
    for seq in seqs:
        if seq < 0 or seq > top:
            out.append(None)
            continue
        row = conn.execute(DIGEST_AT_SQL, (origin, seq)).fetchone()
        out.append(bytes(row[0]) if row is not None else chain_start(origin))
    return out


def tips(conn: sqlite3.Connection, vector: Mapping[str, int]) -> dict[str, tuple[int, bytes]]:
    """Per origin of `vector`, the chain's tip when it covers the vector's entry."""
    out: dict[str, tuple[int, bytes]] = {}
    for origin, top in vector.items():
        row = conn.execute(TIP_SQL, (origin,)).fetchone()
        if row is not None and int(row[0]) >= int(top):
            out[origin] = (int(row[0]), bytes(row[1]))
    return out


def record_divergence(
    conn: sqlite3.Connection,
    *,
    now: str,
    origin: str,
    seq: int,
    peer: str,
    local_digest: bytes | None,
    remote_digest: bytes | None,
    remote_ops: Sequence[Any],
) -> int:
    """Record that `origin`'s chain differs from `peer`'s first at `seq`: one
    `divergence` conflict with both digests and both versions of the op at `seq`, and a
    `fork` conflict (both versions) for each op of `remote_ops` (the peer's ops from
    `seq` on) whose seq we hold with other content. Nothing is inserted or overwritten.
    Returns the conflicts recorded (repeats only bump their counter)."""
    ours = _held(conn, origin, [s for s in (_seq(op) for op in remote_ops) if s] + [seq])
    theirs_at = next((op for op in remote_ops if _seq(op) == seq), None)
    held_at = ours.get(seq)
    why = (f"origin {origin}'s chain differs from peer {peer}'s from origin_seq {seq} on: "
           "the two replicas hold different histories of this origin (a restored backup, a "
           "clone, or a forgery); neither copy was changed")
    if peer == origin:  # the peer serves the origin as its own: one identity, two palaces
        why = (f"peer {peer} serves origin {origin} as its own, with another history from "
               f"origin_seq {seq} on: two palaces run under one identity (a copied palace "
               "directory, or one restored from a backup); give one of them a new identity "
               "with `logsync reidentify --yes`; neither copy was changed")
    rows = [conflict_row(
        now, "divergence", held_at["id"] if held_at else _id(theirs_at), origin, seq, why,
        {"op": row_wire(held_at) if held_at else None, "digest": _hex(local_digest)},
        {"op": theirs_at, "digest": _hex(remote_digest), "peer": peer},
    )]
    for op in remote_ops[:MAX_FORKS_RECORDED]:
        held = ours.get(_seq(op) or -1)
        if held is None or op is theirs_at:
            continue
        try:
            row = remoteops.validate_remote_event(op)
        except ValidationError:
            row = None
        if row is None or not same_event(held, row):
            rows.append(conflict_row(
                now, "fork", held["id"], origin, held["origin_seq"],
                "the same (origin_replica, origin_seq) is held with different content by "
                f"peer {peer} (found by the chain comparison)", row_wire(held), op))
    record_conflicts(conn, rows)
    return len(rows)


def behind(conn: sqlite3.Connection, origin: str, own: bool) -> bool:
    """Whether `origin`'s chain lags its held ops (another program wrote them), or, for
    our own origin (`own`), its tip has no signature: two or three index seeks."""
    top = conn.execute("SELECT max(origin_seq) FROM events WHERE origin_replica = ?",
                       (origin,)).fetchone()[0]
    tip = conn.execute(TIP_SQL.replace("origin_seq, digest", "origin_seq, signature"),
                       (origin,)).fetchone()
    if top is None:
        return False
    return tip is None or int(tip[0]) < int(top) or (own and tip[1] is None)


def bring_up_to_date(conn: sqlite3.Connection, origin: str, sign: Any = None) -> None:
    """Repair `origin`'s chain if it lags its held ops, then (`sign`: our own origin)
    sign what a page may end at (`sign_own_chain`)."""
    if behind(conn, origin, False):
        repair_origin(conn, origin)
    if sign is not None:
        sign_own_chain(conn, origin, sign)


def sign_own_chain(conn: sqlite3.Connection, origin: str, sign: Any) -> int:
    """Sign the own-origin ops a page may end at (every `pagechain.CHECKPOINT`th and the
    tip) that have no signature: ops written before this palace had a key, or by another
    program. Without them a peer that pinned our key could not take those ops from
    anyone. Cheap when done: a current store's tip is signed (a local append signs every
    op), and then nothing is read. Returns how many it signed."""
    tip = conn.execute("SELECT origin_seq, signature FROM logsync_chain WHERE origin = ? "
                       "ORDER BY origin_seq DESC LIMIT 1", (origin,)).fetchone()
    if tip is None or tip[1] is not None:
        return 0
    rows = conn.execute(
        "SELECT origin_seq, digest FROM logsync_chain WHERE origin = ? AND signature IS NULL "
        "AND (origin_seq % ? = 0 OR origin_seq = ?)", (origin, CHECKPOINT, tip[0])).fetchall()
    conn.executemany(
        "UPDATE logsync_chain SET signature = ? WHERE origin = ? AND origin_seq = ?",
        [(sign(bytes(digest)), origin, seq) for seq, digest in rows])
    return len(rows)


def signatures_of(conn: sqlite3.Connection, origin: str, seqs: Sequence[int]) -> dict[int, bytes]:
    """The stored signatures of these ops of `origin`: by key for a short list (a page's
    checkpoints), else over the list's range."""
    if not seqs:
        return {}
    wanted = set(seqs)
    if len(wanted) <= 500:
        marks = ",".join("?" * len(wanted))
        rows = conn.execute(
            f"SELECT origin_seq, signature FROM logsync_chain WHERE origin = ? AND origin_seq "
            f"IN ({marks}) AND signature IS NOT NULL", (origin, *sorted(wanted)))
    else:
        rows = conn.execute(
            "SELECT origin_seq, signature FROM logsync_chain WHERE origin = ? AND origin_seq "
            "BETWEEN ? AND ? AND signature IS NOT NULL", (origin, min(seqs), max(seqs)))
    return {int(r[0]): bytes(r[1]) for r in rows if int(r[0]) in wanted}


def _fast_apply(
    conn: sqlite3.Connection, replica_id: str, events: Sequence[Any], artifacts: Sequence[Any],
    origin: str, after: int, prev: bytes, signatures: Mapping[int, bytes] | None,
    now_ms: int, prepared: Prepared | None,
) -> ApplyResult | None:
    """The page through `fastpage` when all its ops are fresh, else None (nothing
    written: the caller judges it op by op). The origin's top and tip are read once."""
    top, tip = origin_state(conn, origin)
    key = known_key(conn, origin)
    if prepared is None or prepared.events is not events or prepared.key != key \
            or (prepared.origin, prepared.after, prepared.prev) != (origin, after, prev):
        if top != after:
            return None
        prepared = prepare_page(events, origin, after, prev, page_shas(conn, events, artifacts),
                                key, signatures)
    if prepared is None:
        return None
    return apply_prepared(conn, replica_id, prepared, artifacts, top, tip, now_ms)


def _refuse(
    conn: sqlite3.Connection, now_ms: int, events: Sequence[Any], origin: str,
    failure: tuple[str, int, str],
) -> ApplyResult:
    """A page of a signed origin that does not prove itself: its failing op (the last, if
    it is the end signature that is missing) is quarantined, nothing is applied."""
    reason, seq, sentence = failure
    if reason == UNSIGNED:  # nothing wrong with the ops: this server cannot prove them
        return ApplyResult(stopped={origin: f"{reason}: {sentence}"})
    op = next((e for e in events if isinstance(e, Mapping) and e.get("origin_seq") == seq),
              events[-1])
    record_quarantine(conn, [quarantine_row(model.utc_now_iso(now_ms), "event", op,
                                            f"{reason}: {sentence}")])
    return ApplyResult(quarantined=1, stopped={origin: reason})


def _held(conn: sqlite3.Connection, origin: str, seqs: list[int]) -> dict[int, dict[str, Any]]:
    """Our held ops of `origin` at exactly these seqs (validated-row shape)."""
    out: dict[int, dict[str, Any]] = {}
    for chunk in chunks(sorted(set(seqs)), 500):
        marks = ",".join("?" * len(chunk))
        for r in conn.execute(f"SELECT * FROM events WHERE origin_replica = ? AND origin_seq "
                              f"IN ({marks})", (origin, *chunk)).fetchall():
            out[int(r["origin_seq"])] = stored_row(conn, r)
    return out


def _seq(op: Any) -> int | None:
    seq = op.get("origin_seq") if isinstance(op, dict) else None
    ok = isinstance(seq, int) and not isinstance(seq, bool) and 0 < seq <= model.MAX_SEQ
    return seq if ok else None


def _id(op: Any) -> str | None:
    value = op.get("id") if isinstance(op, dict) else None
    return value if isinstance(value, str) and model.ID_RE.fullmatch(value) else None


def _hex(digest: bytes | None) -> str | None:
    return digest.hex() if digest is not None else None


class ChainViews:
    """The chain-comparison methods of `Store` (it provides `_read`, `_reader`,
    `_atomic`, `_wall_ms`)."""

    _wall_ms: Any

    def chain_tips(self, vector: Mapping[str, int] | None = None) -> dict[str, tuple[int, bytes]]:
        """`(seq, digest)` of each origin's chain tip that covers `vector`'s entry
        (default: the store's own vector)."""
        held = self.version_vector() if vector is None else vector  # type: ignore[attr-defined]
        return self._guarded(lambda conn: tips(conn, held))

    def chain_digests_at(self, origin: str, seqs: Sequence[int]) -> list[bytes | None]:
        """``D(s)`` for each seq (the module docstring); None above the chain's tip. The
        origin's chain is brought up to date first if another program wrote to it (and
        our own ops signed), so what we serve or compare is never a stale chain."""
        signer = self._own_signer(origin)
        if not self.read_only and self._guarded(  # type: ignore[attr-defined]
                lambda conn: behind(conn, origin, signer is not None)):
            with self._atomic(durable=False) as conn:  # type: ignore[attr-defined]
                bring_up_to_date(conn, origin, signer)
        return self._guarded(lambda conn: digests_at(conn, origin, seqs))

    def apply_chained(
        self, events: Sequence[Any], artifacts: Sequence[Any], origin: str, after: int,
        prev: bytes, signatures: Mapping[int, bytes] | None = None,
        prepared: Prepared | None = None,
    ) -> ApplyResult:
        """`apply_remote` for a page whose server says its chain of `origin` at `after` is
        `prev`, in one transaction: applied only when ours is the same (else nothing is,
        and the result names the divergence, `diverged`), and for an origin whose key we
        know, only when the page proves itself (`pagechain.verify_page`: else its failing
        op is quarantined and the origin stops). Verified signatures are stored.
        `prepared`: `prepare_chained` of this page (another thread may have run it while
        an earlier page was written); a page all of whose ops are fresh goes the fast
        path (`store/fastpage.py`), anything else the checks below."""
        now_ms = self._wall_ms()
        own = origin == self.replica_id  # type: ignore[attr-defined]
        with self._atomic(durable=False) as conn:  # type: ignore[attr-defined]
            if not own and events and chaining._ENABLED:
                fast = _fast_apply(conn, self.replica_id, events, artifacts,  # type: ignore[attr-defined]
                                   origin, after, prev, signatures, now_ms, prepared)
                if fast is not None:
                    return fast
            bring_up_to_date(conn, origin, self._own_signer(origin))
            # our own origin is verified from the peer's `prev` (the signature binds it):
            # ours may differ below it (a slot re-used after a restore), and apply then
            # records the forks and recovers the rest
            if not own and digests_at(conn, origin, [after])[0] != prev:
                return ApplyResult(
                    diverged={origin: after},
                    stopped={origin: f"chain divergence: the peer's chain at origin_seq "
                             f"{after} is not ours"})
            key = known_key(conn, origin)
            proof = None
            if key is not None and events:
                proof = verify_page(key, prev, events, page_shas(conn, events, artifacts),
                                    signatures or {})
                if not isinstance(proof, PageProof) and own and proof[0] == UNSIGNED:
                    # ops of ours this peer cannot prove: recorded, never recovered, and
                    # their slots never re-used (as through a hub)
                    return apply_page(conn, self.replica_id, events, artifacts,  # type: ignore[attr-defined]
                                      now_ms, own_verified=False)
                if not isinstance(proof, PageProof):
                    return _refuse(conn, now_ms, events, origin, proof)
            # ops of ours recover only proven by our own key (verified above)
            result = apply_page(
                conn, self.replica_id, events, artifacts, now_ms,  # type: ignore[attr-defined]
                own_verified=origin != self.replica_id or proof is not None,  # type: ignore[attr-defined]
                known=None if proof is None else {(origin, s): link
                                                  for s, link in proof.links.items()})
            if proof is not None:
                conn.executemany(
                    "UPDATE logsync_chain SET signature = ? WHERE origin = ? AND origin_seq = ? "
                    "AND digest = ?",
                    [(sig, origin, seq, proof.digests[seq])
                     for seq, sig in proof.signatures.items()])
            signer = self._own_signer(origin)
            if signer is not None and result.applied:
                # ops of ours recovered above a slot we re-used (a restore, a clone) chain
                # differently from the copy that signed them: we are their origin, so we
                # sign what we now hold, and can serve it on
                sign_own_chain(conn, origin, signer)
            return result

    def prepare_chained(
        self, events: Sequence[Any], artifacts: Sequence[Any], origin: str, after: int,
        prev: bytes, signatures: Mapping[int, bytes] | None = None,
    ) -> Prepared | None:
        """The fast path's work on a page, outside any transaction (it reads the origin's
        key and the named artifacts' shas; `apply_chained` checks both again): None when
        the page is not one for it."""
        if origin == self.replica_id or not events:  # type: ignore[attr-defined]
            return None

        def read(conn: sqlite3.Connection) -> tuple[bytes | None, dict[str, str | None]]:
            return known_key(conn, origin), page_shas(conn, events, artifacts)
        key, shas = self._guarded(read)
        return prepare_page(events, origin, after, prev, shas, key, signatures)

    def _own_signer(self, origin: str) -> Any:
        """How to sign `origin`'s digests: only our own origin, only with our key."""
        key = self.signing_key  # type: ignore[attr-defined]
        if origin != self.replica_id or key is None:  # type: ignore[attr-defined]
            return None
        return lambda digest: sign_digest(key, digest)

    def tip_signatures(self, tips: Mapping[str, tuple[int, bytes]]) -> dict[str, bytes]:
        """The signature we hold of each tip in `tips` (from `chain_tips`), if any."""
        def read(conn: sqlite3.Connection) -> dict[str, bytes]:
            out = {}
            for origin, (seq, _digest) in tips.items():
                held = signatures_of(conn, origin, [seq])
                if seq in held:
                    out[origin] = held[seq]
            return out
        return self._guarded(read)

    def adopt_tip_signatures(self, points: Sequence[tuple[str, int, bytes, bytes]]) -> int:
        """Take a peer's signatures of chain points we hold unsigned: each only if its
        origin's key is known, our digest at that seq is the signed one and the signature
        verifies; returns how many were taken. Ops that reached us through a hub (which
        cannot carry signatures) thus become servable to peers that verify."""
        if self.read_only or not points:  # type: ignore[attr-defined]
            return 0
        points = points[:MAX_TIP_SIGNATURES]
        held = self._guarded(lambda conn: [seq in signatures_of(conn, origin, [seq])
                                           for origin, seq, _d, _s in points])
        points = [p for p, signed in zip(points, held, strict=True) if not signed]
        if not points:  # signed here already: no write transaction (MemPalace writes too)
            return 0
        with self._atomic(durable=False) as conn:  # type: ignore[attr-defined]
            taken = []
            for origin, seq, digest, signature in points:
                key = known_key(conn, origin)
                if key is None or seq in signatures_of(conn, origin, [seq]):
                    continue
                if digests_at(conn, origin, [seq])[0] != digest:
                    continue
                if verify_digest(key, digest, signature):
                    taken.append((signature, origin, seq, digest))
            conn.executemany(
                "UPDATE logsync_chain SET signature = ? WHERE origin = ? AND origin_seq = ? "
                "AND digest = ?", taken)
            return len(taken)

    def chain_signatures(self, origin: str, seqs: Sequence[int]) -> dict[int, bytes]:
        """The signatures we hold for these ops of `origin`."""
        return self._guarded(lambda conn: signatures_of(conn, origin, seqs))

    def pin_keys(self, keys: Mapping[str, bytes], peer: str) -> dict[str, str]:
        """Take the origin keys peer `peer` (its replica id) published, by
        `keyring.pin_published`; a key other than the one held is recorded as a
        `key_change` conflict (at most `MAX_KEY_CHANGES_RECORDED` per call), and one the
        origin's id certifies replaces one pinned on first sight, also recorded. Returns
        origin -> 'new' | 'same' | 'changed' | 'replaced' | 'ignored'."""
        held = self._guarded(lambda conn: {o: held_key(conn, o) for o in keys})
        quiet = {o: published_outcome(held[o], o, key, peer) for o, key in keys.items()}
        if all(outcome in ("same", "ignored") for outcome in quiet.values()):
            return quiet  # the usual round and a relay's page: nothing to write
        now = model.utc_now_iso(self._wall_ms())
        with self._atomic(durable=False) as conn:  # type: ignore[attr-defined]
            before = {o: known_key(conn, o) for o in keys}
            outcomes = {o: pin_published(conn, o, key, now, peer) for o, key in keys.items()}
            changed = [o for o, outcome in outcomes.items() if outcome in ("changed", "replaced")]
            record_conflicts(conn, [conflict_row(
                now, "key_change", None, origin, None,
                f"peer {peer} publishes another public key for origin {origin} than the one "
                "held here; " + ("the origin's id certifies it, so it replaces the key "
                                 "pinned on first sight" if outcomes[origin] == "replaced"
                                 else "the held key stays, and ops signed by the other are "
                                 "refused"),
                {"public_key": (before[origin] or b"").hex()},
                {"public_key": keys[origin].hex(), "peer": peer},
            ) for origin in changed[:MAX_KEY_CHANGES_RECORDED]])
        return outcomes

    def record_divergence(self, **found: Any) -> int:
        """`record_divergence` in one write transaction (the keywords of that function
        but `now`)."""
        now = model.utc_now_iso(self._wall_ms())
        with self._atomic(durable=False) as conn:  # type: ignore[attr-defined]
            return record_divergence(conn, now=now, **found)

    def _guarded(self, read: Any) -> Any:
        try:
            return read(self._reader())  # type: ignore[attr-defined]
        except sqlite3.Error as exc:
            raise StoreError(describe_fault(self.db_path, "read", exc)) from None  # type: ignore[attr-defined]
