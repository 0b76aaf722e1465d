"""The snapshot join's fast chain check (`logsync/snapshot/chaincheck.py`).

It must prove every chain the reference (`chaining.canonical`, `logsync/chain.py`) finds
intact, for any row a store can hold, and never one the reference would not: planted
defects (a number where text belongs, with the digest a naive rendering would give;
invalid UTF-8; a NULL in a required field; a chain consistent with an altered op) are
refused, in one sentence, with nothing installed.
"""

from __future__ import annotations

import hashlib
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync import chain
from logsync.peers import Peer
from logsync.snapshot.chaincheck import ChainProof, prove_chains
from logsync.snapshot.forked import may_fork
from logsync.snapshot.joining import join_if_empty
from logsync.store import Store
from logsync.store.audit import audit_store
from logsync.store.chaining import ROW_COLUMNS, canonical
from logsync.store.schema import INSERT_EVENT, migrate

ORIGIN = "rep_0123456789ab"


# A forger's idea of the canonical bytes: SQLite's json_object over the stored values as
# they are, numbers unquoted and NULLs as null (what a path without type checks would hash).
_NAIVE_SQL = "SELECT CAST(json_object({}) AS BLOB) FROM events e WHERE origin_replica = ? " \
    "AND origin_seq = ?".format(", ".join(
        f"'{k}', " + ("json('[]')" if k == "artifacts" else "json(e.metadata_json)"
                      if k == "metadata" else f"e.{k}") for k in chain.CANONICAL_KEYS))


# Any text SQLite can store from Python (no lone surrogates): control characters, quotes,
# backslashes, NUL, U+2028, astral characters.
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)
_optional = st.one_of(st.none(), st.just(""), _text)
_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), _text)
_metadata_text = st.one_of(
    st.just("{}"), st.just(""), st.just("not json"), st.just("[1, 2]"), st.just("NaN"),
    st.just('{"x": NaN}'), _text,
    st.dictionaries(_text, st.recursive(_json_scalar, lambda inner: st.lists(inner, max_size=3)
                                        | st.dictionaries(_text, inner, max_size=3),
                                        max_leaves=6), max_size=4).map(
        lambda d: __import__("json").dumps(d, ensure_ascii=bool(len(d) % 2))),
)
_row = st.fixed_dictionaries({
    **{k: _text for k in chain.REQUIRED_TEXT if k != "origin_replica"},
    **{k: _optional for k in chain.OPTIONAL_TEXT},
    "body": _text, "metadata_json": _metadata_text,  # NOT NULL in the schema
    "artifacts": st.dictionaries(st.from_regex(r"art_[a-z0-9]{1,4}", fullmatch=True),
                                 st.one_of(st.none(), st.from_regex(r"[0-9a-f]{64}",
                                                                    fullmatch=True)),
                                 max_size=2),
})


def new_store(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    migrate(conn, ORIGIN)
    conn.execute("COMMIT")
    return conn


def insert_ops(conn: sqlite3.Connection, ops: list[dict[str, Any]]) -> list[bytes]:
    """Store `ops` as seqs 1..n of ORIGIN (ids made unique), then chain them by the
    reference rule over what was stored; the canonical bytes the reference gives each."""
    conn.execute("BEGIN")
    rows = []
    for seq, op in enumerate(ops, start=1):
        values = {**op, "id": f"{op['id']}#{seq}", "origin_replica": ORIGIN, "origin_seq": seq}
        rows.append(tuple(values[c] for c in ROW_COLUMNS))
        conn.execute(INSERT_EVENT, rows[-1])
        for art, sha in op["artifacts"].items():
            conn.execute("INSERT INTO event_artifacts (event_id, artifact_id) VALUES (?, ?)",
                         (values["id"], art))
            if sha is not None:
                conn.execute(
                    "INSERT OR IGNORE INTO artifacts (id, kind, sha256, size_bytes, content, "
                    "created_by, created_at) VALUES (?, 'patch', ?, 0, '', 'a', 't')",
                    (art, sha))
    canonicals, prev = [], chain.chain_start(ORIGIN)
    for seq, row in enumerate(rows, start=1):
        sha_of = dict(conn.execute(
            "SELECT ea.artifact_id, a.sha256 FROM event_artifacts ea LEFT JOIN artifacts a "
            "ON a.id = ea.artifact_id WHERE ea.event_id = ?", (row[0],)).fetchall())
        data = canonical(row, sha_of)
        prev = chain.next_digest(prev, data)
        conn.execute("INSERT INTO logsync_chain (origin, origin_seq, digest) VALUES (?, ?, ?)",
                     (ORIGIN, seq, prev))
        canonicals.append(data)
    conn.execute("COMMIT")
    return canonicals


def alone() -> None:
    """This process runs no thread but the main one, so it forks (`snapshot/forked.py`):
    waits up to 20 s for threads earlier tests left (anyio's idle workers end in 10 s; a
    thread Python counts as ended is still the kernel's for a moment)."""
    end = time.monotonic() + 20
    while not may_fork() and time.monotonic() < end:
        time.sleep(0.05)
    assert may_fork(), f"threads still running: {threading.enumerate()}"


def forked_proof(path: Path, **plan: int) -> tuple[bool, set[str]]:
    """The proof with half its ranges in a forked child (if it has two ranges or more and
    this process may fork: `forked_cases.py` runs where it always may): whether it forked,
    and what it proved."""
    with ChainProof(path, fork=True, **plan) as proof:
        return proof.forked, proof.finish()


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp) / "store.sqlite3"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_row, min_size=1, max_size=6))
def test_every_chain_the_reference_computed_is_proven(ops: list[dict[str, Any]]) -> None:
    """Chained by the reference over what was stored, any rows a store can hold (text of
    every kind, odd metadata, artifacts held or not) are proven, in one range or many."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.sqlite3"
        conn = new_store(path)
        try:
            insert_ops(conn, ops)
        finally:
            conn.close()
        assert prove_chains(path) == {ORIGIN}
        assert prove_chains(path, split=1, parts=3) == {ORIGIN}
        forked, proven = forked_proof(path, split=1, parts=3)
        assert proven == {ORIGIN} and (len(ops) > 1 or not forked)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_row, min_size=2, max_size=5), victim=st.integers(0, 4),
       column=st.sampled_from([*chain.REQUIRED_TEXT, *chain.OPTIONAL_TEXT, "body",
                               "metadata_json"]),
       value=_optional)
def test_a_changed_value_is_proven_only_when_its_canonical_bytes_are_unchanged(
        ops: list[dict[str, Any]], victim: int, column: str, value: str | None) -> None:
    """Edit one stored value under an unchanged chain: proven exactly when the reference
    audit also finds no problem (e.g. "" for None in an optional field)."""
    victim %= len(ops)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.sqlite3"
        conn = new_store(path)
        try:
            insert_ops(conn, ops)
            try:
                conn.execute(f"UPDATE events SET {column} = ? WHERE origin_seq = ?",
                             (value, victim + 1))
            except sqlite3.IntegrityError:  # NOT NULL, or a duplicate id
                return
            try:
                reference_ok = audit_store(conn).origins[0].problem is None
            except (TypeError, ValueError):  # a NULL where the rule needs text
                reference_ok = False
        finally:
            conn.close()
        assert (ORIGIN in prove_chains(path, split=1, parts=2)) == reference_ok


def _forge_from(conn: sqlite3.Connection, seq: int, render: Any) -> None:
    """Rewrite ORIGIN's digests from `seq` on with `render(seq) -> bytes` (a forger's
    own idea of the canonical bytes), keeping the chain internally consistent."""
    prev = conn.execute("SELECT digest FROM logsync_chain WHERE origin = ? AND origin_seq = ?",
                        (ORIGIN, seq - 1)).fetchone()
    digest = prev[0] if prev else chain.chain_start(ORIGIN)
    for (n,) in conn.execute("SELECT origin_seq FROM events WHERE origin_replica = ? AND "
                             "origin_seq >= ? ORDER BY origin_seq", (ORIGIN, seq)).fetchall():
        digest = hashlib.sha256(digest + render(n)).digest()
        conn.execute("UPDATE logsync_chain SET digest = ? WHERE origin = ? AND origin_seq = ?",
                     (digest, ORIGIN, n))


def _sql_render(conn: sqlite3.Connection) -> Any:
    """What a forger who renders rows with `_NAIVE_SQL` would hash for a row."""
    def render(seq: int) -> bytes:
        return bytes(conn.execute(_NAIVE_SQL, (ORIGIN, seq)).fetchone()[0])
    return render


def _plain_ops(n: int) -> list[dict[str, Any]]:
    return [{"id": f"evt{i}", "type": "t", "stream": "s", "room": "r", "from_agent": "a",
             "created_at": "2026-01-01T00:00:00Z", "hlc": f"{i:016d}", "topic": None,
             "to_agent": "b", "correlation_id": None, "branch": None, "base_commit": None,
             "status": None, "body": f"body {i}", "metadata_json": '{"k": 1}',
             "artifacts": {}} for i in range(n)]


def _number_in_text(conn: sqlite3.Connection) -> None:
    """A number in a TEXT column (possible only by editing the schema), with the chain
    forged the way json_object would render it (unquoted)."""
    conn.execute("PRAGMA writable_schema=ON")
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
    conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'events'",
                 (sql.replace("to_agent TEXT", "to_agent ANY"),))
    conn.execute("PRAGMA writable_schema=OFF")


def test_planted_defects_are_never_proven(scratch: Path) -> None:
    conn = new_store(scratch)
    insert_ops(conn, _plain_ops(30))
    conn.close()
    assert prove_chains(scratch, split=1, parts=3) == {ORIGIN}

    conn = sqlite3.connect(scratch, isolation_level=None)
    _number_in_text(conn)
    conn.close()
    conn = sqlite3.connect(scratch, isolation_level=None)  # the edited schema, read anew
    conn.execute("UPDATE events SET to_agent = 5 WHERE origin_seq = 12")
    assert conn.execute("SELECT typeof(to_agent) FROM events WHERE origin_seq = 12"
                        ).fetchone()[0] == "integer"
    _forge_from(conn, 12, _sql_render(conn))
    conn.close()
    assert prove_chains(scratch) == set()
    assert prove_chains(scratch, split=1, parts=3) == set()
    assert forked_proof(scratch, split=1, parts=3)[1] == set()

    conn = new_store(scratch.with_name("utf8.sqlite3"))
    insert_ops(conn, _plain_ops(10))
    conn.execute("UPDATE events SET body = CAST(x'6869ff' AS TEXT) WHERE origin_seq = 4")
    _forge_from(conn, 4, _sql_render(conn))  # the digest over the raw bytes
    conn.close()
    assert prove_chains(scratch.with_name("utf8.sqlite3")) == set()

    conn = new_store(scratch.with_name("null.sqlite3"))
    insert_ops(conn, _plain_ops(10))
    conn.execute("UPDATE events SET hlc = NULL WHERE origin_seq = 7")
    _forge_from(conn, 7, _sql_render(conn))  # `"hlc":null`, which the rule never writes
    conn.close()
    assert prove_chains(scratch.with_name("null.sqlite3")) == set()


def _msgspec_artifacts(row: tuple, pairs: dict) -> bytes:
    """The bytes a writer that hands the artifacts to msgspec unchecked would hash: bytes
    as base64, floats as msgspec writes them (`1e16`, where the reference refuses or
    writes `1e+16`)."""
    import msgspec

    return canonical(row, {}).replace(b'"artifacts":[]', b'"artifacts":' + msgspec.json.encode(
        [[a, pairs[a]] for a in sorted(pairs)]), 1)


@pytest.mark.parametrize("artifact, sha", [(b"art", None), ("art_x", b"\x01" * 32),
                                           ("art_x", 1e16)],
                         ids=["blob-id", "blob-sha", "real-sha"])
def test_artifacts_of_other_types_are_never_proven_by_another_rendering(
        scratch: Path, artifact: object, sha: object) -> None:
    """An artifact link or sha256 of a type no validated store holds (a peer's file is
    the peer's to write; `artifacts.sha256` redeclared without affinity keeps a REAL),
    chained with another writer's bytes for it: not proven."""
    conn = new_store(scratch)
    conn.execute("PRAGMA writable_schema=ON")
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'artifacts'").fetchone()[0]
    conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'artifacts'",
                 (sql.replace("sha256 TEXT", "sha256 BLOB"),))
    conn.execute("PRAGMA writable_schema=OFF")
    conn.close()
    conn = sqlite3.connect(scratch, isolation_level=None)
    insert_ops(conn, _plain_ops(3))
    conn.execute("INSERT INTO event_artifacts (event_id, artifact_id) VALUES ('evt1#2', ?)",
                 (artifact,))
    if sha is not None:
        conn.execute("INSERT INTO artifacts (id, kind, sha256, size_bytes, content, created_by, "
                     "created_at) VALUES (?, 'patch', ?, 0, '', 'a', 't')", (artifact, sha))
    row = conn.execute(f"SELECT {', '.join(ROW_COLUMNS)} FROM events WHERE origin_seq = 2"
                       ).fetchone()
    _forge_from(conn, 2, lambda seq: _msgspec_artifacts(row, {artifact: sha}) if seq == 2 else
                canonical(conn.execute(f"SELECT {', '.join(ROW_COLUMNS)} FROM events WHERE "
                                       "origin_seq = ?", (seq,)).fetchone(), {}))
    conn.close()
    assert prove_chains(scratch) == set()


def test_missing_extra_and_reordered_entries_are_left_to_the_reference(scratch: Path) -> None:
    conn = new_store(scratch)
    insert_ops(conn, _plain_ops(12))
    conn.execute("DELETE FROM logsync_chain WHERE origin_seq = 5")
    conn.close()
    assert prove_chains(scratch, split=1, parts=2) == set()
    conn = sqlite3.connect(scratch, isolation_level=None)
    conn.execute("INSERT INTO logsync_chain (origin, origin_seq, digest) VALUES (?, 5, ?)",
                 (ORIGIN, b"\0" * 32))
    conn.close()
    assert prove_chains(scratch) == set()
    conn = sqlite3.connect(scratch, isolation_level=None)
    conn.execute("DELETE FROM events WHERE origin_seq = 5")  # entry 5 now extra
    conn.close()
    assert prove_chains(scratch) == set()


# ── through the join: refused in one sentence, nothing installed ─────────


@pytest.fixture
def signed(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "source")
    for i in range(140):
        store.append_event("task.request", "s", "r", "pi@laptop", to_agent="codex@desk",
                           body=f"event {i}", metadata={"n": i})
    yield store
    store.close()


def _refused(store: Store, tmp_path: Path, edit: Any) -> str:
    import test_snapshot as ts  # the fake peer and the snapshot maker of the join tests

    peer = ts.FakePeer(store)
    try:
        peer.body = ts.snapshot_bytes(store, edit)
        said: list[str] = []
        joiner = tmp_path / "joiner"
        assert join_if_empty(joiner, [Peer(url=peer.server.url)], say=said.append) is None
    finally:
        peer.server.close()
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].endswith("; pulling op by op instead")
    assert sorted(p.name for p in joiner.iterdir()) == [
        "logstream.sqlite3", "logsync-signing-key", "replica.json"]
    with Store.open(joiner) as fresh:
        assert fresh.latest_event_id() is None
    return said[0]


def _forged_body(conn: sqlite3.Connection) -> None:
    """Op 70's body altered and the chain rewritten to match it: only the signatures at
    the checkpoints above it can tell."""
    origin = conn.execute("SELECT origin_replica FROM events LIMIT 1").fetchone()[0]
    conn.execute("UPDATE events SET body = 'forged' WHERE origin_seq = 70")
    global ORIGIN
    saved, ORIGIN = ORIGIN, origin
    try:
        cols = ", ".join(ROW_COLUMNS)
        _forge_from(conn, 70, lambda seq: canonical(conn.execute(
            f"SELECT {cols} FROM events WHERE origin_seq = ?", (seq,)).fetchone(), {}))
    finally:
        ORIGIN = saved


def _number_in_to_agent(conn: sqlite3.Connection) -> None:
    """Op 12's to_agent a number, and the chain forged the way an unguarded SQL path
    would render it (unquoted)."""
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    origin = conn.execute("SELECT origin_replica FROM events LIMIT 1").fetchone()[0]
    _number_in_text(conn)
    edit = sqlite3.connect(path, isolation_level=None)
    global ORIGIN
    saved, ORIGIN = ORIGIN, origin
    try:
        edit.execute("UPDATE events SET to_agent = 5 WHERE origin_seq = 12")
        _forge_from(edit, 12, _sql_render(edit))
    finally:
        ORIGIN = saved
        edit.close()


def test_a_chain_consistent_with_an_altered_op_fails_its_signatures(
        signed: Store, tmp_path: Path) -> None:
    said = _refused(signed, tmp_path, _forged_body)
    assert "signature of origin" in said and "at seq 128 does not verify" in said


def test_a_null_where_text_belongs_is_refused_without_a_traceback(
        signed: Store, tmp_path: Path) -> None:
    def null_hlc(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE events SET hlc = NULL WHERE origin_seq = 9")

    said = _refused(signed, tmp_path, null_hlc)
    assert "Traceback" not in said and "seq 9" in said, said


def test_a_number_where_text_belongs_is_refused_though_its_chain_was_forged_to_match(
        signed: Store, tmp_path: Path) -> None:
    said = _refused(signed, tmp_path, _number_in_to_agent)
    assert "departs from its ops at seq 12 (mismatch)" in said, said


def test_an_unreadable_file_proves_nothing_and_raises_nothing(scratch: Path) -> None:
    scratch.write_bytes(b"SQLite format 3\x00" + b"\x07" * 4000)
    assert prove_chains(scratch) == set()
    scratch.write_bytes(b"not a database at all" * 100)
    assert prove_chains(scratch) == set()


def test_a_good_snapshot_is_joined_without_the_reference_recomputation(
        signed: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is what a join uses: the reference recomputes only what it could
    not prove (here nothing), so the join's cost is the fast path's."""
    import test_snapshot as ts

    from logsync.store import audit

    def recomputed(*_: Any) -> Any:
        raise AssertionError("the reference recomputation ran for a proven chain")

    monkeypatch.setattr(audit, "first_problem", recomputed)
    peer = ts.FakePeer(signed)
    try:
        joined = join_if_empty(tmp_path / "joiner", [Peer(url=peer.server.url)])
    finally:
        peer.server.close()
    assert joined is not None and joined.events == 140


def test_the_signatures_prepare_keeps_are_checked_beside_the_other_checks(
        signed: Store, tmp_path: Path) -> None:
    """`verify_kept_signatures` checks, on the file as downloaded, exactly the signatures
    the audit would check after `prepare` (a checkpoint's and the highest signed op's,
    with the kept key): an origin with a bad one is left to the audit, which names it."""
    from logsync.snapshot import SnapshotRefused
    from logsync.snapshot.checking import audit, prepare, verify_kept_signatures
    from logsync.snapshot.making import make_copy

    made = make_copy(signed.db_path, signed.replica_id)
    origin, me, other = signed.replica_id, "rep_000000000001", "rep_0000000000ff"
    try:
        assert verify_kept_signatures(made.path, me, origin) == {origin: 3}  # 64, 128, 140
        assert verify_kept_signatures(made.path, me, other) == {origin: 3}  # certified
        conn = sqlite3.connect(made.path, isolation_level=None)
        conn.execute("UPDATE logsync_chain SET signature = zeroblob(64) WHERE origin_seq = 128")
        conn.close()
        fresh = verify_kept_signatures(made.path, me, origin)
        assert fresh == {}
        prepare(made.path, me, None, origin, "2026-01-01T00:00:00Z")
        with pytest.raises(SnapshotRefused, match="at seq 128 does not verify"):
            audit(made.path, {origin}, fresh)
    finally:
        made.path.unlink()


def test_a_key_the_pull_would_not_take_is_not_checked(signed: Store) -> None:
    """Neither certified by its id nor the serving peer's: prepare drops the key and its
    signatures, so nothing of it is checked (or counted as verified)."""
    from logsync.snapshot.checking import verify_kept_signatures
    from logsync.snapshot.making import make_copy

    made = make_copy(signed.db_path, signed.replica_id)
    try:
        conn = sqlite3.connect(made.path, isolation_level=None)
        conn.execute("UPDATE logsync_keys SET public_key = zeroblob(32)")
        conn.close()
        assert verify_kept_signatures(made.path, "rep_000000000001", "rep_0000000000ff") == {}
    finally:
        made.path.unlink()
