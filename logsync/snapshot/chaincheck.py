"""The fast check of every stored chain in a snapshot candidate (RFC 004 §9.6).

Why: the reference recomputation (`store/audit.py`, `logsync verify`) walks each origin
op by op with its own reads; a join of a large store spent most of its time there. Here
one query per seq range reads the rows, each op's canonical bytes are the reference's
own (`chaining.canonical`, written by msgspec in C), and the ranges of one origin are
independent, so nothing is recomputed twice.

Each op is checked against the *stored* digest of the op below it: the stored digest of
op n must equal SHA-256(stored digest of the held op below || canonical bytes of op n),
starting from `chain_start(origin)`. When that holds for every op, every op has its own
chain entry and there are no other entries, the stored chain is the recomputed one,
op by op (by induction), so an origin may be split into seq ranges checked apart: the
join hands about half of them to a forked child (`ChainProof`, `forked.py`).

This check only ever *proves* an origin; it never reports a problem. Whatever it cannot
prove (a digest that differs, a missing or extra entry, a seq that is not an integer, a
text that is not UTF-8) is left to the reference audit, which finds and names the first
departure exactly as `logsync verify` does. An op that names artifacts takes its
artifacts' stored sha256s from one more read for that op alone.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from logsync.chain import chain_start
from logsync.snapshot.forked import Forked, may_fork
from logsync.store.audit import CHAIN_ORIGINS_SQL
from logsync.store.chaining import ORIGINS_SQL, ROW_COLUMNS, canonical

SPLIT_OPS = 4096  # an origin with more ops than this is checked in seq ranges
CHILD_GRACE_S = 60.0  # a forked child's answer may come this much later than ours (x4)
_NO_ARTIFACTS: dict[str, str | None] = {}  # never written: `canonical` only reads it
_WIDTH, _SEQ = len(ROW_COLUMNS), ROW_COLUMNS.index("origin_seq")
RANGE_SQL = (
    f"SELECT {', '.join(f'e.{c}' for c in ROW_COLUMNS)}, c.digest, EXISTS (SELECT 1 FROM "
    "event_artifacts ea WHERE ea.event_id = e.id) FROM events e "
    "LEFT JOIN logsync_chain c ON c.origin = e.origin_replica AND c.origin_seq = e.origin_seq "
    "WHERE e.origin_replica = ? AND e.origin_seq >= ? AND e.origin_seq <= ? "
    "ORDER BY e.origin_seq"
)
# The stored digest of the held op just below a range (its predecessor in the chain).
BELOW_SQL = (
    "SELECT c.digest FROM events e LEFT JOIN logsync_chain c ON c.origin = e.origin_replica "
    "AND c.origin_seq = e.origin_seq WHERE e.origin_replica = ? AND e.origin_seq < ? "
    "ORDER BY e.origin_seq DESC LIMIT 1"
)
ONE_OP_SQL = (
    f"SELECT {', '.join(f'e.{c}' for c in ROW_COLUMNS)}, ea.artifact_id, a.sha256 "
    "FROM events e LEFT JOIN event_artifacts ea ON ea.event_id = e.id "
    "LEFT JOIN artifacts a ON a.id = ea.artifact_id "
    "WHERE e.origin_replica = ? AND e.origin_seq = ?"
)


class _Unproven(Exception):
    """This range cannot be proven here (the reference audit decides)."""


def prove_chains(path: Path, *, split: int = SPLIT_OPS, parts: int = 2) -> set[str]:
    """The origins whose stored chain this check proves equal to the recomputed one,
    all proven in this process (each range on its own read-only connection)."""
    with ChainProof(path, split=split, parts=parts) as proof:
        return proof.finish()


class ChainProof:
    """One proof of a file's chains. Made with `fork=True` in a process with no other
    thread, it hands about half the ops (whole seq ranges) to a forked child at once
    (`forked.py`), so the caller may start threads of its own (the integrity check)
    before `finish` proves the rest here. The child never outlives the proof: leaving
    the `with` block kills and reaps it; a child without an answer has its ranges proven
    here, so forking changes only the time a proof takes.
    """

    def __init__(self, path: Path, *, split: int = SPLIT_OPS, parts: int = 2,
                 fork: bool = False) -> None:
        self.path = path
        try:
            self._plans = _plan(path, split, parts)
        except sqlite3.Error:  # an unreadable file: the checks that follow say what is wrong
            self._plans = {}
        jobs = [(origin, lo, hi) for origin, (_, ranges) in self._plans.items()
                for lo, hi in ranges]
        self._mine, self._theirs = (_halves(jobs) if fork and len(jobs) > 1 and may_fork()
                                    else (jobs, []))
        theirs = self._theirs
        self._child = Forked.start(lambda: [_check_range(path, *j) for j in theirs]) \
            if theirs else None
        if self._child is None:
            self._mine, self._theirs = self._mine + self._theirs, []

    @property
    def forked(self) -> bool:
        """A child proves part of the ranges (or did, until finish collected it)."""
        return bool(self._theirs)

    def finish(self) -> set[str]:
        began = time.monotonic()
        counts = {job: _check_range(self.path, *job) for job in self._mine}
        if self._theirs:
            # the child proves as many ops as this process did: far longer is no answer
            answer = None if self._child is None else \
                self._child.result(CHILD_GRACE_S + 4 * (time.monotonic() - began))
            if not (isinstance(answer, list) and len(answer) == len(self._theirs)
                    and all(type(n) is int for n in answer)):
                answer = [_check_range(self.path, *job) for job in self._theirs]
            counts.update(zip(self._theirs, answer, strict=True))
        held: dict[str, int] = {}
        for (origin, _, _), count in counts.items():
            held[origin] = -1 if count < 0 or held.get(origin, 0) < 0 else \
                held.get(origin, 0) + count
        return {o for o, (ops, _) in self._plans.items() if held.get(o) == ops}

    def __enter__(self) -> ChainProof:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._child is not None:
            self._child.close()


def _halves(jobs: list[tuple[str, int, int]]) -> tuple[list[tuple[str, int, int]],
                                                       list[tuple[str, int, int]]]:
    """The ranges split into two shares of about equal seq spans (largest first, each to
    the lighter share)."""
    shares: tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]] = ([], [])
    weight = [0, 0]
    for job in sorted(jobs, key=lambda j: j[1] - j[2]):
        side = 0 if weight[0] <= weight[1] else 1
        shares[side].append(job)
        weight[side] += job[2] - job[1] + 1
    return shares


def _plan(path: Path, split: int, parts: int) -> dict[str, tuple[int, list[tuple[int, int]]]]:
    """Per origin held with a chain: its op count and the seq ranges to check. An origin
    this check cannot prove at all (entries and ops differ in number, or a seq is not an
    integer) is left out: the reference audit names its first departure."""
    conn = _connect(path)
    try:
        events = {r[0] for r in conn.execute(ORIGINS_SQL)}
        chained = {r[0] for r in conn.execute(CHAIN_ORIGINS_SQL)}
        plans: dict[str, tuple[int, list[tuple[int, int]]]] = {}
        for origin in events & chained:
            ops, low, top = conn.execute(
                "SELECT count(*), min(origin_seq), max(origin_seq) FROM events "
                "WHERE origin_replica = ?", (origin,)).fetchone()
            entries = conn.execute("SELECT count(*) FROM logsync_chain WHERE origin = ?",
                                   (origin,)).fetchone()[0]
            if type(low) is not int or type(top) is not int or entries != ops:
                continue
            plans[origin] = (ops, _ranges(low, top, parts if ops > split else 1))
        return plans
    finally:
        conn.close()


def _ranges(low: int, top: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous inclusive seq ranges covering low..top."""
    step = max(1, (top - low + parts) // parts)
    bounds = [(lo, min(top, lo + step - 1)) for lo in range(low, top + 1, step)]
    return bounds if bounds else [(low, top)]


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                           isolation_level=None, check_same_thread=False)


def _check_range(path: Path, origin: str, lo: int, hi: int) -> int:
    """The ops of `origin` in lo..hi, each checked against its stored digest; their
    count, or -1 when any of them cannot be proven."""
    conn = _connect(path)
    try:
        conn.execute("BEGIN")  # one read snapshot (nothing else writes the candidate)
        below = conn.execute(BELOW_SQL, (origin, lo)).fetchone()
        prev = chain_start(origin) if below is None else below[0]
        return _check_rows(conn, origin, prev, conn.execute(RANGE_SQL, (origin, lo, hi)))
    except (_Unproven, sqlite3.Error, ValueError, TypeError, AttributeError, RecursionError):
        return -1  # e.g. a text that is not UTF-8: the reference audit decides
    finally:
        conn.close()


def _check_rows(conn: sqlite3.Connection, origin: str, prev: Any,
                rows: Iterable[tuple[Any, ...]]) -> int:
    sha256, count, last, width, seq_at = hashlib.sha256, 0, None, _WIDTH, _SEQ
    for row in rows:
        seq, stored = row[seq_at], row[width]
        if type(stored) is not bytes or type(prev) is not bytes or type(seq) is not int or \
                (last is not None and seq <= last):
            raise _Unproven
        data = _bytes_with_artifacts(conn, origin, seq) if row[width + 1] else \
            canonical(row[:width], _NO_ARTIFACTS)
        if sha256(prev + data).digest() != stored:
            raise _Unproven
        prev, last, count = stored, seq, count + 1
    return count


def _bytes_with_artifacts(conn: sqlite3.Connection, origin: str, seq: Any) -> bytes:
    """One op's canonical bytes by the write path's own rule (`chaining.held_ops` pairs
    each op with the stored sha256 of every artifact it names)."""
    width, row, pairs = len(ROW_COLUMNS), None, {}
    for found in conn.execute(ONE_OP_SQL, (origin, seq)):
        if row is not None and found[:width] != row:
            raise _Unproven  # two ops at one seq
        row = found[:width]
        if found[width] is not None:
            pairs[found[width]] = found[width + 1]
    if row is None:
        raise _Unproven
    return canonical(row, pairs)
