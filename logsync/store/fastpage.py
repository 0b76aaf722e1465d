"""The fast path of one page (issue 12, item 2): a page of one origin whose ops all lie
above everything we hold of it, so `apply.APPLY_CHECKS` can only answer "insert".

Why: the reference path (`apply.apply_page`) classifies each op through seven checks,
hashes each op twice (the page proof from the op as sent, the chain from the row) and
writes with one `executemany` step per row. The fast path does the same work once per
op, and nothing it decides differs from the reference:

- `prepare_page` (pure, no SQL: it may run in another thread while an earlier page is
  written) validates every op with the same validator, chains each validated row (the
  bytes `chaining.canonical` gives, which `extend_chains` and `verify` hash) from the
  page's `prev`, and checks every signature `pagechain.verify_page` would check. Anything
  else (an invalid op or artifact, a seq out of order, an id twice, an artifact without
  a sha, a signature that does not verify) answers None.
- `fresh` (inside the write transaction, for `apply.apply_prepared`) checks what makes
  every op fresh: our top and chain tip of the origin are exactly `after` (digest
  `prev`), no page id is held, the page's artifacts all valid, every named artifact's
  sha still the one prepared. Any doubt answers False *before anything is written*, and
  the caller runs the reference checks instead, whose answer (a conflict, a quarantine,
  a refusal) is then the one recorded.

A signed op chains the same from the served op and from its validated row (the store's
`verify` relies on it; `tests/test_fastpage.py` checks it against `verify_page`).
Rows are written with multi-row INSERTs: SQLite runs a whole chunk in one step without
the GIL, so the thread preparing the next page is not convoyed behind every row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logsync import model, remoteops
from logsync.chain import canonical_row, chain_start, compact_metadata, next_digest
from logsync.errors import ValidationError
from logsync.keys import verify_digest
from logsync.pagechain import carries_signature
from logsync.store.chaining import INSERT_CHAIN
from logsync.store.rows import chunks
from logsync.store.schema import INSERT_EVENT


@dataclass(frozen=True)
class Prepared:
    """One page, validated, chained and proven, ready to insert."""

    events: Sequence[Any]  # the page as served (a prepared page is used for it alone)
    origin: str
    after: int
    prev: bytes  # the digest the page chains from (ours at `after`, checked at commit)
    key: bytes | None  # the key its signatures verified under (None: none checked)
    shas: dict[str, str]  # sha256 of each artifact the ops name, as chained
    rows: list[tuple[Any, ...]]  # `INSERT_EVENT` tuples, in origin_seq order
    links: list[tuple[str, str]]  # (event_id, artifact_id)
    chain: list[tuple[str, int, bytes, bytes | None]]  # `INSERT_CHAIN` tuples
    last: int  # the origin_seq of the page's last op
    row_chunks: list[Chunk]  # `rows` as `plan_rows` writes them
    chain_chunks: list[Chunk]


def prepare_page(
    events: Sequence[Any], origin: str, after: int, prev: bytes,
    shas: Mapping[str, str | None], key: bytes | None,
    signatures: Mapping[int, bytes] | None,
) -> Prepared | None:
    """The page ready to insert, or None when the reference path must judge it. `shas`:
    what `chainreads.page_shas` gives; `key` None checks no signature (an origin whose
    key we do not know, whose page the reference path would not verify either)."""
    if not events:
        return None
    sigs = signatures or {}
    last = events[-1].get("origin_seq") if isinstance(events[-1], Mapping) else None
    if key is not None and (type(last) is not int or last not in sigs):
        return None  # the reference refuses it (`UNSIGNED`)
    rows: list[tuple[Any, ...]] = []
    links: list[tuple[str, str]] = []
    chain: list[tuple[str, int, bytes, bytes | None]] = []
    ids: set[str] = set()
    used: dict[str, str] = {}
    digest, seen = prev, after
    validated = remoteops.remote_values
    for op in events:
        try:
            values, named = validated(op)
        except ValidationError:
            return None
        ident, seq = values[0], values[15]
        if values[14] != origin or seq <= seen or ident in ids:
            return None
        seen = seq
        ids.add(ident)
        pairs: dict[str, str | None] = {}
        for art in named:
            sha = shas.get(art)
            if sha is None:
                return None  # the reference quarantines it (missing artifact)
            pairs[art] = used[art] = sha
            links.append((ident, art))
        try:  # `chaining.canonical` without its repair of types no validated row has
            data = canonical_row(*values[:13], compact_metadata(values[13]), *values[14:],
                                 pairs)
        except (TypeError, ValueError, AttributeError):
            return None
        digest = next_digest(digest, data)
        signature = sigs.get(seq) if key is not None and carries_signature(seq, last) else None
        if signature is not None and not verify_digest(key, digest, signature):
            return None  # the reference quarantines it (bad signature)
        rows.append(values)
        chain.append((origin, seq, digest, signature))
    return Prepared(events, origin, after, prev, key, used, rows, links, chain, seen,
                    plan_rows(INSERT_EVENT, rows), plan_rows(INSERT_CHAIN, chain))


def carried_artifacts(artifacts: Sequence[Any]) -> dict[str, dict[str, Any]] | None:
    """The page's artifacts validated, by id, when every one is valid and each id comes
    once (then `apply_artifacts` stores or matches exactly these and quarantines none),
    else None."""
    out = {}
    for raw in artifacts:
        try:
            art = model.validate_remote_artifact(raw)
        except ValidationError:
            return None
        out[art["id"]] = art
    return out if len(out) == len(artifacts) else None


def fresh(conn: sqlite3.Connection, prepared: Prepared, tip: tuple[int, bytes] | None,
          top: int, artifacts: Sequence[Any]) -> dict[str, dict[str, Any]] | None:
    """The page's artifacts validated (`carried_artifacts`, so they are validated once)
    when every op of `prepared` is one the checks insert, given the origin's chain `tip`
    and held `top` read in this transaction: nothing held above `after`, our chain at
    `after` is the page's `prev`, no id held, the page's artifacts all valid, and each
    named artifact held with the sha prepared, or brought by the page with it; else None."""
    after, origin = prepared.after, prepared.origin
    if tip is None:  # nothing chained: only a page from the start, from d_0
        if top != 0 or after != 0 or prepared.prev != chain_start(origin):
            return None
    elif top != after or tip != (after, prepared.prev):
        return None
    carried = carried_artifacts(artifacts)
    if carried is None:
        return None
    held = held_shas(conn, list(prepared.shas))
    for art, sha in prepared.shas.items():
        brought = carried.get(art)
        if held.get(art, brought["sha256"] if brought is not None else None) != sha:
            return None
    ids = [row[0] for row in prepared.rows]
    for chunk in chunks(ids, 500):
        marks = ",".join("?" * len(chunk))
        if conn.execute(f"SELECT 1 FROM events WHERE id IN ({marks}) LIMIT 1",
                        chunk).fetchone():
            return None
    return carried


def origin_state(conn: sqlite3.Connection, origin: str) -> tuple[int, tuple[int, bytes] | None]:
    """The origin's top held origin_seq (0: none) and its chain tip `(seq, digest)`."""
    top = conn.execute("SELECT max(origin_seq) FROM events WHERE origin_replica = ?",
                       (origin,)).fetchone()[0]
    tip = conn.execute("SELECT origin_seq, digest FROM logsync_chain WHERE origin = ? "
                       "ORDER BY origin_seq DESC LIMIT 1", (origin,)).fetchone()
    return top or 0, None if tip is None else (int(tip[0]), bytes(tip[1]))


def page_shas(
    conn: sqlite3.Connection, events: Sequence[Any], artifacts: Sequence[Any]
) -> dict[str, str | None]:
    """The sha256 of every artifact the page names: what we hold, else what the page (or
    the round) brought, as declared (apply checks it against the content)."""
    found: set[str] = set()
    for e in events:  # `type is dict` first: an ABC check per op costs more than the rest
        if type(e) is dict or isinstance(e, Mapping):
            ids = e.get("artifact_ids")
            if ids and isinstance(ids, list):
                found.update(a for a in ids if isinstance(a, str))
    shas: dict[str, str | None] = dict(held_shas(conn, sorted(found)))
    for art in artifacts:
        if isinstance(art, Mapping) and isinstance(art.get("id"), str) \
                and art["id"] not in shas and isinstance(art.get("sha256"), str):
            shas[art["id"]] = art["sha256"]
    return shas


def held_shas(conn: sqlite3.Connection, ids: list[str]) -> dict[str, str]:
    """The stored sha256 of each of these artifacts we hold."""
    out: dict[str, str] = {}
    for chunk in chunks(sorted(ids), 500):
        marks = ",".join("?" * len(chunk))
        out.update((r[0], r[1]) for r in conn.execute(
            f"SELECT id, sha256 FROM artifacts WHERE id IN ({marks})", chunk))
    return out


def write_prepared(conn: sqlite3.Connection, prepared: Prepared) -> None:
    """Insert the page's rows, links and chain entries (after `fresh` said yes)."""
    run_chunks(conn, INSERT_EVENT, prepared.rows, prepared.row_chunks)
    insert_rows(conn, INSERT_LINK, prepared.links)
    run_chunks(conn, INSERT_CHAIN, prepared.chain, prepared.chain_chunks)


INSERT_LINK = "INSERT OR IGNORE INTO event_artifacts (event_id, artifact_id) VALUES (?, ?)"


def insert_rows(conn: sqlite3.Connection, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """`executemany(sql, rows)` as a few multi-row statements: executemany steps once per
    row, and each step takes the GIL back, waiting behind a preparing thread each time."""
    run_chunks(conn, sql, rows, plan_rows(sql, rows))


# Rows per multi-row INSERT, largest first: each size is one cached statement, and any
# count is a sum of them (17 columns x 1024 rows stays under SQLite's 32766 variables).
# Few large chunks: the writing thread takes the GIL back once per chunk, and another
# thread running Python makes it wait up to the switch interval each time.
_CHUNK_SIZES = (1024, 256, 64, 16, 4, 1)
_SHAPES: dict[tuple[str, int], str] = {}
Chunk = tuple[str, int, list[Any]]  # (statement, rows, their values flattened)


def plan_rows(sql: str, rows: Sequence[tuple[Any, ...]]) -> list[Chunk]:
    """The multi-row statements that insert `rows` (a single-row `INSERT ... VALUES
    (?, ...)` each) in order, with their parameters flattened: pure, so a preparing
    thread does it and the writer only binds and steps."""
    chunks_out: list[Chunk] = []
    start = 0
    for size in _CHUNK_SIZES:
        while len(rows) - start >= size:
            chunk = rows[start : start + size]
            chunks_out.append((_shape(sql, size), size,
                               [value for row in chunk for value in row]))
            start += size
    return chunks_out


def run_chunks(conn: sqlite3.Connection, sql: str, rows: Sequence[tuple[Any, ...]],
               planned: list[Chunk]) -> None:
    """Insert `rows` as `plan_rows` planned: the same rows in the same order (so the same
    rowids) as `executemany(sql, rows)`, one SQLite step (without the GIL) per chunk."""
    if not rows:
        return
    most = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    if max(len(values) for _, _, values in planned) > most:
        conn.executemany(sql, rows)  # a build allowing fewer variables
        return
    for statement, _size, values in planned:
        conn.execute(statement, values)


def _shape(sql: str, size: int) -> str:
    shape = _SHAPES.get((sql, size))
    if shape is None:
        head, _, values = sql.partition(" VALUES ")
        shape = _SHAPES[(sql, size)] = f"{head} VALUES {', '.join([values] * size)}"
    return shape
